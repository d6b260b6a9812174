# shellcheck shell=bash
# Sourced by tools/sanitize.sh and tools/check_aarch64.sh: the ctest -E regex of the tests
# that a slower run of the suite (sanitized, or emulated) leaves out for time. Always the
# tests that train for minutes to show learning and the CUDA twins' rehearsals (the twin
# tests' logic against a CPU stand-in, which the plain suite runs); with `listed` also the
# whole-program tests tools/sanitize_left_out.txt names (that file says which and why).
#   left_out=$(left_out_tests_regex listed|unlisted)
left_out_tests_regex() {
  local regex='^(Learning\.TinyModelLearnsToReverseHeldOutSequences|ParsePipeline\.TinyParserBeatsTheRightBranchingBaseline|Multi30kBleu\.TrainedModelClearsTheFloorThatBrokenDecodersCannotReach|Rehearsal\..*)$'
  local name
  if [ "$1" = listed ]; then
    while read -r name; do
      case $name in '#'* | '') continue ;; esac
      regex+="|^${name//./\\.}\$"
    done < "$(dirname "${BASH_SOURCE[0]}")/sanitize_left_out.txt"
  fi
  printf '%s\n' "$regex"
}
