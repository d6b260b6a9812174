#include "common/input_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string_view>

#include "common/error.h"

namespace thpc {

// From the file's status and access(2), without opening it: a named pipe opened and
// closed here would lose its writer (SIGPIPE) or hold the reader that opens it next.
std::string unreadable_file_reason(const std::string& path) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (status.type() == std::filesystem::file_type::not_found) return "no such file";
  if (status.type() == std::filesystem::file_type::directory) {
    return "is a directory, not a file";
  }
  if (::access(path.c_str(), R_OK) != 0) return std::strerror(errno);
  return "";
}

std::ifstream open_input_file(const std::string& path, const std::string& what) {
  const std::string named = what.empty() ? "" : " (" + what + ")";
  if (path.empty()) THPC_FAIL("an empty file name" << named << ": a variable left unset?");
  const std::string why = unreadable_file_reason(path);
  if (!why.empty()) THPC_FAIL(path << ": " << why << named);
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) THPC_FAIL(path << ": " << (errno != 0 ? std::strerror(errno) : "cannot open") << named);
  return in;
}

bool begins_as_hdf5(const std::string& head) {
  // HDF5's signature is at byte 0 or past a user block of 512 x 2^k bytes (a checkpoint's
  // header takes the first 512).
  const std::string_view signature("\x89HDF\r\n\x1a\n", 8);
  for (size_t at = 0; at + signature.size() <= head.size(); at = at == 0 ? 512 : 2 * at) {
    if (head.compare(at, signature.size(), signature) == 0) return true;
  }
  return false;
}

bool begins_as_checkpoint(const std::string& head) {
  return head.rfind(kCheckpointHeaderStart, 0) == 0;
}

std::string binary_format_problem(const std::string& head, const std::string& path) {
  const auto starts = [&head](std::string_view magic) { return head.rfind(magic, 0) == 0; };
  // (the formats' magic numbers: RFC 1952, bzip2's "BZh" and block size, the xz and
  // Zstandard frame formats, a zip's local file header)
  struct Compressed {
    std::string_view magic, name, decompress;
  };
  static constexpr Compressed kCompressed[] = {
      {std::string_view("\x1f\x8b", 2), "gzip", "gunzip -k"},
      {std::string_view("BZh", 3), "bzip2", "bunzip2 -k"},
      {std::string_view("\xfd" "7zXZ\0", 6), "xz", "unxz -k"},
      {std::string_view("\x28\xb5\x2f\xfd", 4), "Zstandard", "unzstd"},
      {std::string_view("PK\x03\x04", 4), "zip", "unzip"}};
  for (const Compressed& format : kCompressed) {
    // ("BZh" is also how a line of text may begin: bzip2's next byte is its block size)
    if (!starts(format.magic)) continue;
    if (format.name == "bzip2" && (head.size() < 4 || head[3] < '1' || head[3] > '9')) continue;
    return "is " + std::string(format.name) + "-compressed, not text: decompress it first (" +
           std::string(format.decompress) + " " + path + ")";
  }
  if (begins_as_checkpoint(head)) return "is a checkpoint, not text: give the text file";
  // UTF-16 text (Windows' "Unicode"), told by its byte-order mark: its NULs and bytes past
  // ASCII were said as a NUL byte to repair or as Latin-1 to convert.
  if (starts(std::string_view("\xff\xfe", 2)) || starts(std::string_view("\xfe\xff", 2))) {
    return "is UTF-16 text (its byte-order mark), not UTF-8: convert it first (iconv -f "
           "UTF-16 -t UTF-8 " + path + " > NEW)";
  }
  if (begins_as_hdf5(head)) {
    return "is an HDF5 file (a checkpoint or a data shard?), not text: give the text file";
  }
  return "";
}

std::ifstream open_text_file(const std::string& path, const std::string& what) {
  std::ifstream in = open_input_file(path, what);
  std::error_code not_regular;
  if (!std::filesystem::is_regular_file(path, not_regular)) return in;
  std::string head(4096, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  const std::string problem = binary_format_problem(head, path);
  if (!problem.empty()) {
    const std::string named = what.empty() ? "" : " (" + what + ")";
    // (the advice after the colon; what the file is named before it)
    const size_t advice = problem.find(": ");
    THPC_FAIL(path << ": " << problem.substr(0, advice) << named << problem.substr(advice));
  }
  in.clear();
  in.seekg(0);
  return in;
}

std::string read_input_file(const std::string& path, const std::string& what) {
  std::ifstream in = open_input_file(path, what);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) {
    THPC_FAIL(path << ": read error" << (what.empty() ? "" : " (" + what + ")"));
  }
  return bytes.str();
}

std::string nul_byte_problem(const std::string& path, int64_t line_number,
                             const std::string& line) {
  const size_t at = line.find('\0');
  if (at == std::string::npos) return "";
  return path + ":" + std::to_string(line_number) + ": a NUL byte at byte " +
         std::to_string(at + 1) + " of the line: text holds none (a file damaged by a crash, "
         "whose blocks read as zeros, or not a text file?)";
}

std::string carriage_return_lines_problem(const std::string& path, int64_t carriage_returns,
                                          int64_t lines) {
  // A classic Mac file has no line feed: it reads as one line, holding a carriage return
  // for each sentence but the last (its own, at the end, is taken for a CRLF's). Two
  // sentences are one carriage return in one line, as a stray one in a one-line text is:
  // taken for the two sentences (translated as one, they broke the output's alignment).
  const bool one_line_of_sentences = lines == 1 && carriage_returns >= 1;
  if (carriage_returns <= lines && !one_line_of_sentences) return "";
  // Said as counted: the carriage returns before the lines' ends ("2 in 1 line" for
  // "one\rtwo\r", whose last ends the line, read as a file's 2 carriage returns).
  const std::string counted = std::to_string(lines) +
                              (lines == 1 ? " line holds " : " lines hold ") +
                              std::to_string(carriage_returns) +
                              (carriage_returns == 1 ? " carriage return" : " carriage returns") +
                              " before " + (lines == 1 ? "its end" : "their ends");
  if (lines == 1) {
    return path + ": its lines end in a carriage return alone (classic Mac OS text: what " +
           "reads as " + counted + ")";
  }
  // With \n line ends too it is not all classic Mac text (a helper's walk: "a\rb\rc\nd\n"
  // was called so): what its carriage returns are is the user's to say, and one answer
  // keeps the line count.
  return path + ": more of its sentences end in a carriage return alone than in a line end " +
         "(its " + counted + ": classic Mac OS text joined to text of \\n line ends?); if " +
         "they are not sentence ends, delete them (tr -d '\\r' < FILE > NEW) or make them " +
         "spaces, else";
}

}  // namespace thpc
