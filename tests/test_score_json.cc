// transformer_score -f json: sacreBLEU's default output, field for field, and the two
// pieces of Python it rests on (repr of a float, json.dumps of a string).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data_dir.h"
#include "metrics/json_text.h"
#include "sacrebleu_peer.h"

namespace {

using thpc::metrics::json_string;
using thpc::metrics::python_float_repr;

TEST(PythonFloatRepr, AsPythonWritesThem) {
  const std::vector<std::pair<double, std::string>> cases = {
      {28.3, "28.3"},          {100.0, "100.0"},       {0.0, "0.0"},
      {-0.0, "-0.0"},          {0.0001, "0.0001"},     {0.00001, "1e-05"},
      {1e15, "1000000000000000.0"}, {1e16, "1e+16"},   {1.5e16, "1.5e+16"},
      {123456789012345.6, "123456789012345.6"},        {0.1 + 0.2, "0.30000000000000004"},
      {28.301225088283296, "28.301225088283296"},      {1e-310, "1e-310"},
      {1.7976931348623157e308, "1.7976931348623157e+308"}, {0.009900990099009901,
                                                            "0.009900990099009901"},
  };
  for (const auto& [value, expected] : cases) EXPECT_EQ(python_float_repr(value), expected);
}

TEST(JsonString, AsJsonDumps) {
  // ensure_ascii escapes DEL as well (Python's ESCAPE_ASCII: all but ' ' to '~').
  EXPECT_EQ(json_string("a\"b\\c\n\r\t\b\f\x01\x1f\x7f", true),
            "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\\u007f\"");
  EXPECT_EQ(json_string("\x7f", false), "\"\x7f\"");
  // Bytes that are not UTF-8, in a file name on sacreBLEU's command line: Python's
  // surrogateescape makes each a lone \udcXX (overlong, surrogate, past U+10FFFF and
  // truncated forms byte by byte), as json.dumps(sys.argv[i]) prints them.
  EXPECT_EQ(json_string("x\xffy", true), "\"x\\udcffy\"");
  EXPECT_EQ(json_string("\xc0\x80|\xed\xa0\x80|\xf4\x90\x80\x80", true),
            "\"\\udcc0\\udc80|\\udced\\udca0\\udc80|\\udcf4\\udc90\\udc80\\udc80\"");
  EXPECT_EQ(json_string("\xe6\x97x|\xe0\x9f\x80|\xed\x9f\xbf|\xef\xbf\xbd", true),
            "\"\\udce6\\udc97x|\\udce0\\udc9f\\udc80|\\ud7ff|\\ufffd\"");
  EXPECT_EQ(json_string("x\xffy", false), "\"x\xEF\xBF\xBDy\"");
  EXPECT_EQ(json_string("\u03bc = 1 \u00b1 2", false), "\"\u03bc = 1 \u00b1 2\"");
  EXPECT_EQ(json_string("\u03bc \u00e4 \u65e5 \U0001F600", true),
            "\"\\u03bc \\u00e4 \\u65e5 \\ud83d\\ude00\"");
}

struct SacreBleuJson : thpc::SacreBleuPeer {
  SacreBleuJson() : SacreBleuPeer("the fixed cases above still check the formatting") {}

  // Python's repr of each double, by bit pattern.
  std::vector<std::string> python_reprs(const std::vector<double>& values) {
    std::string program = "import struct, sys\nfor line in sys.stdin:\n"
                          "    print(repr(struct.unpack('<d', bytes.fromhex(line.strip()))[0]))\n";
    const std::string script = (dir / "repr.py").string(), input = (dir / "values").string();
    std::ofstream(script) << program;
    std::ofstream out(input);
    for (double value : values) {
      unsigned char bytes[8];
      std::memcpy(bytes, &value, 8);
      for (unsigned char byte : bytes) {
        const char* hex = "0123456789abcdef";
        out << hex[byte >> 4] << hex[byte & 15];
      }
      out << "\n";
    }
    out.close();
    const thpc::ProcessResult result = thpc::run_process(python + " " + script + " < " + input);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    std::vector<std::string> lines;
    std::stringstream stream(result.output);
    for (std::string line; std::getline(stream, line);) lines.push_back(line);
    return lines;
  }
};

// Doubles of every magnitude, the decimal ones a score prints among them (float(f"{x:.wf}")),
// and random bit patterns: Python's repr of each.
TEST_F(SacreBleuJson, FloatReprOfManyDoublesAsPython) {
  std::mt19937_64 random(7);
  std::vector<double> values;
  for (int i = 0; i < 3000; ++i) {
    const double magnitude = std::pow(10.0, std::uniform_real_distribution<double>(-8, 20)(random));
    values.push_back(std::uniform_real_distribution<double>(0, 1)(random) * magnitude);
    values.push_back(std::round(values.back() * 1000) / 1000);
    uint64_t bits = random();
    double any = 0;
    std::memcpy(&any, &bits, 8);
    if (std::isfinite(any)) values.push_back(any);
  }
  const std::vector<std::string> expected = python_reprs(values);
  ASSERT_EQ(expected.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(python_float_repr(values[i]), expected[i]) << i;
  }
}

TEST_F(SacreBleuJson, SameJsonAsSacreBleu) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  const std::string wmt17 = thpc::data_path("sacrebleu_tests/wmt17_en-de");
  // The first 300 lines of each: sacreBLEU's start and TER take the time.
  const auto head = [&](const std::string& name) {
    std::ifstream in(wmt17 + "/" + name);
    std::vector<std::string> lines;
    for (std::string line; lines.size() < 300 && std::getline(in, line);) lines.push_back(line);
    return write_lines(name, lines);
  };
  const std::string reference = head("newstest2017-ende-ref.de");
  const std::string uedin = head("newstest2017.uedin-nmt.4722.en-de");
  const std::string kit = head("newstest2017.KIT.4950.en-de");
  // One metric an object, several a list; -ci's fields; -b's scores in a list; -sl stays
  // text; several systems, plain and with both paired tests (BLEU: sacreBLEU's JSON cannot
  // hold chrF's or TER's float32 results).
  for (const std::string& arguments :
       {reference + " -i " + uedin + " -f json",
        reference + " -i " + uedin + " -m ter -w 0 -f json",
        reference + " -i " + uedin + " -m bleu chrf ter -ci -cin 200 -w 3 -f json",
        reference + " -i " + uedin + " -m bleu chrf -b -ci -cin 100 -f json",
        reference + " -i " + uedin + " -m chrf -sl -f json",
        reference + " -i " + uedin + " " + kit + " -m chrf ter bleu -w 2 -f json",
        reference + " -i " + uedin + " " + kit + " -m bleu -pbs -pbsn 200 -f json",
        reference + " -i " + uedin + " " + kit + " -m bleu ter -par -parn 200 -f json"}) {
    expect_same_lines("", arguments, "");
  }
  // SACREBLEU_FORMAT decides over -f, as there.
  expect_same_lines("SACREBLEU_FORMAT=JSON", reference + " -i " + uedin + " -f text", "");
  expect_same_lines("SACREBLEU_FORMAT=text", reference + " -i " + uedin + " -f json", "");
}

TEST(ScoreJson, NonAsciiSystemNamesEscapedAsSacreBleu) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("test_score_json_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string reference = (dir / "ref.txt").string();
  const std::string first = (dir / "syst\u00e8me.txt").string();
  const std::string second = (dir / "\U0001F600.txt").string();
  std::ofstream(reference) << "a small cat sat here\n";
  std::ofstream(first) << "a cat\n";
  std::ofstream(second) << "a small cat sat here\n";
  // DEL and a byte that is not UTF-8: \u007f, and Python's surrogateescape's \udcff.
  const std::string third = (dir / "d\x7f\xff.txt").string();
  std::ofstream(third) << "a cat\n";
  const thpc::ProcessResult result = thpc::run_score(reference + " -i " + first + " " +
                                                     second + " '" + third + "' -f json");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // json.dumps(..., indent=4) with ensure_ascii: \u escapes, a surrogate pair past U+FFFF.
  EXPECT_NE(result.output.find("syst\\u00e8me.txt\",\n        \"BLEU\": \"0.0\"\n    }"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("\\ud83d\\ude00.txt\",\n        \"BLEU\": \"100.0\"\n    }"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("d\\u007f\\udcff.txt\",\n        \"BLEU\": \"0.0\"\n    }\n]"),
            std::string::npos)
      << result.output;
}

}  // namespace
