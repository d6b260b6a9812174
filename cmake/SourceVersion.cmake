# Run at every build (the thpc_source_version target): writes OUT, the definition of
# thpc::source_version(), from the checkout in SRC: its commit (git describe --always
# --dirty, 12 hex digits) and that commit's date, "unknown" outside a git checkout (a
# tarball). OUT is written only when its text changes, so a build at the same commit
# compiles nothing again.
#   cmake -DSRC=<source dir> -DOUT=<file> -P cmake/SourceVersion.cmake
set(version "unknown")
find_package(Git QUIET)
if(GIT_FOUND AND EXISTS "${SRC}/.git")
  execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SRC}" describe --always --dirty --abbrev=12
                  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE described ERROR_QUIET)
  execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SRC}" log -1 --format=%cs
                  OUTPUT_VARIABLE day OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE dated ERROR_QUIET)
  if(described EQUAL 0 AND NOT commit STREQUAL "")
    set(version "git ${commit}")
    if(dated EQUAL 0 AND NOT day STREQUAL "")
      string(APPEND version " of ${day}")
    endif()
  endif()
endif()
set(text "// Written by cmake/SourceVersion.cmake at build time; not in the repository.
#include \"common/source_version.h\"

const char* thpc::source_version() { return \"${version}\"; }
")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
