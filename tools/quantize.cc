// transformer_quantize: writes a quantized checkpoint once, for decoding in int8 where a
// model is deployed (after CTranslate2's converters with --quantization int8).
//
//   transformer_quantize --checkpoint FILE --output FILE
//
// Every weight matrix (the layers' projections and feed-forward layers, and the tied
// embedding, which is also the output projection) is stored in int8 with a scale per
// output channel, as `transformer_decode --compute-type int8` would quantize it at load
// (kernels/cpu/int8_matmul.h: 8-bit, +-127); biases, layer norms and learned positions
// stay fp32; no Adam moments. A base model's file shrinks from 252 MB to about 64 MB, and
// loading it reads and verifies that much. transformer_decode --compute-type int8 takes
// the stored weights as they are (a CPU whose products take 7-bit weights quantizes them
// again at load, and says so); any other compute type decodes their dequantized values,
// with a note. The embedding lookup reads the dequantized rows.
//
// Exit codes: 0 success, 1 a bad or already quantized checkpoint, 2 a bad command line
// (an output that is the input, a training run's file, or anything but an earlier
// parameters-only checkpoint).
#include <boost/program_options.hpp>

#include <filesystem>
#include <iomanip>
#include <iostream>
#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/output_file.h"
#include "common/error.h"
#include "decode/compute_type.h"
#include "model/checkpoint_params.h"
#include "tools/tool_main.h"

namespace {

namespace po = boost::program_options;

struct Arguments {
  std::string checkpoint;
  std::string output;
  std::string type = "int8";
  bool help = false;
};

double megabytes(const std::string& path) {
  std::error_code error;
  const auto bytes = std::filesystem::file_size(path, error);
  return error ? 0.0 : static_cast<double>(bytes) / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  Arguments arguments;
  po::options_description options(
      "usage: transformer_quantize --checkpoint FILE --output FILE\n\n"
      "Writes a parameters-only checkpoint whose weight matrices are int8 with a scale per\n"
      "output channel, for transformer_decode --compute-type int8.\n\noptions");
  options.add_options()("help,h", "print this text and exit")(
      "version", "print the git commit the program was built from and exit")(
      "checkpoint", po::value(&arguments.checkpoint)->required(),
      "the float checkpoint to quantize: a step_*.h5, best.h5 or an average (required)")(
      "output", po::value(&arguments.output)->required(),
      "the quantized checkpoint to write (required)")(
      "type", po::value(&arguments.type)->default_value(arguments.type),
      "the stored type of the weight matrices: int8");
  const auto parse = [&](int count, char** values) {
    arguments.help = thpc::tools::parse_options(options, count, values).count("help") > 0;
    if (!arguments.help) {
      if (arguments.type != "int8") {
        THPC_FAIL("--type '" << arguments.type << "': the one stored type is int8");
      }
      if (arguments.output.empty()) THPC_FAIL("--output is empty: give a file name");
      // Never over the input, a training run's file or anything but an earlier
      // parameters-only checkpoint (checkpoint/output_file.h); written atomically.
      thpc::check_output_path("--output", arguments.output, {arguments.checkpoint},
                              thpc::OutputKind::Checkpoint);
    }
    return arguments;
  };
  const auto run = [](const Arguments& command) {
    const thpc::Checkpoint source =
        thpc::read_checkpoint(command.checkpoint, thpc::CheckpointParts::ParamsOnly);
    const std::string diverged =
        thpc::diverged_parameters_refusal(source, command.checkpoint, "quantizing it");
    if (!diverged.empty()) throw thpc::tools::Refusal(diverged);
    if (!source.quantized.empty()) {
      THPC_FAIL("checkpoint " << command.checkpoint << " is quantized already (its weight "
                              << "matrices are int8): give the float checkpoint it was made from");
    }
    thpc::Checkpoint quantized = thpc::quantize_checkpoint(source);
    // The float checkpoint it was made from, at the head of its configuration: an int8
    // copy and its source could not be told to belong together (a helper's walk).
    // (the digest where the stored configuration describes the parameters: not of a
    // hand-made file's, whose quantization goes on without it)
    std::string digest;
    try {
      digest = ", params_sha256 " + thpc::parameters_sha256(source, command.checkpoint);
    } catch (const thpc::Error&) {
    }
    const std::string from =
        std::filesystem::absolute(command.checkpoint).lexically_normal().string() + " (step " +
        std::to_string(source.step) + digest + ")";
    quantized.config_ini = thpc::with_header_lines(
        quantized.config_ini, {thpc::header_line(thpc::kQuantizedFrom, from)});
    // ... and the data it was trained on, as an average keeps it.
    quantized.corpus_sha256 = source.corpus_sha256;
    quantized.valid_sha256 = source.valid_sha256;
    const std::string replaced = thpc::checkpoint_output_replaces(command.output);
    thpc::write_checkpoint(command.output, quantized);
    int64_t values = 0;
    for (const thpc::QuantizedTensor& tensor : quantized.quantized) {
      values += static_cast<int64_t>(tensor.values.size());
    }
    std::cout << "quantized " << quantized.quantized.size() << " weight matrices ("
              << values << " values) of " << command.checkpoint
              << " to int8 with a scale per output channel\nwrote " << command.output << " ("
              << std::fixed << std::setprecision(1) << megabytes(command.output)
              << " MB; the input: " << megabytes(command.checkpoint) << " MB"
              << (replaced.empty() ? "" : "; replacing " + replaced) << ")\n";
    return 0;
  };
  return thpc::tools::tool_main("transformer_quantize", thpc::tools::usage_text(options), argc,
                                argv, parse, run, "the --output checkpoint");
}
