// The ini parser and the checks of every key (src/config): any bytes as a config file.
// A configuration that loads must survive its own round trip: a checkpoint stores
// Config::to_ini() and decoding, --eval and averaging read it back with
// load_config_text.
#include "config/config.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace thpc;
  fuzz::refused_or_read([&] {
    const Config config = load_config_text(std::string(fuzz::bytes_of(data, size)), "fuzz.ini");
    const std::string ini = config.to_ini();
    fuzz::require(load_config_text(ini, "fuzz.ini").to_ini() == ini,
                  "to_ini() does not read back as itself:\n" + ini);
    validate(config);
  });
  return 0;
}
