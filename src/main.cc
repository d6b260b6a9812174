// transformer_hpc: trains the Transformer of "Attention Is All You Need".
//
//   transformer_hpc CONFIG.ini [--section.key=value ...] [--dry-run] [--help]
//
// Exit codes: 0 success, 1 a runtime failure, 2 a bad command line or config.
#include <iostream>

#include "common/error.h"
#include "config/config.h"
#include "model/params.h"
#include "model/transformer.h"
#include "train/trainer.h"

namespace {

int dry_run(const thpc::Config& config) {
  int vocab = config.model.vocab_size;
  if (vocab == 0) vocab = thpc::make_training_source(config)->vocab_size();
  thpc::ParamStore table;
  thpc::add_transformer_parameters(config.model, vocab, table);
  std::cout << config.to_ini() << "\n# parameters: " << table.count() << " (vocabulary "
            << vocab << ")\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  thpc::Config config;
  try {
    if (!thpc::parse_command_line(argc, argv, config)) return 0;  // --help
  } catch (const thpc::Error& e) {
    std::cerr << "transformer_hpc: " << e.what() << "\n(see transformer_hpc --help)\n";
    return 2;
  }
  try {
    if (config.dry_run) return dry_run(config);
    thpc::Trainer trainer(config);
    trainer.run(std::cout);
  } catch (const std::exception& e) {
    std::cerr << "transformer_hpc: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
