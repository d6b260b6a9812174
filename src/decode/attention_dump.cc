#include "decode/attention_dump.h"

#include "common/error.h"
#include "io/atomic_file.h"
#include "io/hdf5.h"

namespace thpc {
namespace {

using hdf5::Handle;

// Datasets of the dump beside hdf5::Writer's attributes and groups.
class DumpWriter : public hdf5::Writer {
 public:
  explicit DumpWriter(const std::string& path) : hdf5::Writer("attention dump " + path) {}

  // Variable-length UTF-8 strings: one (dims empty, a scalar) or an array.
  void strings(hid_t group, const std::string& name, const std::vector<std::string>& values,
               const std::vector<hsize_t>& dims) const {
    Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
    check(H5Tset_size(type.get(), H5T_VARIABLE), "string type");
    check(H5Tset_cset(type.get(), H5T_CSET_UTF8), "string type");
    std::vector<const char*> pointers;
    for (const std::string& value : values) pointers.push_back(value.c_str());
    const Handle dataset = create_dataset(group, name, name, type.get(), dims);
    write(dataset.get(), name, type.get(), pointers.data());
  }

  void floats(hid_t group, const std::string& name, const std::vector<float>& values,
              const std::vector<hsize_t>& dims) const {
    hsize_t count = 1;
    for (hsize_t dim : dims) count *= dim;
    THPC_CHECK(values.size() == count, name << " holds " << values.size() << " values, not "
                                            << count);
    dataset(group, name, name, dims, values.data());
  }

  void ids(hid_t group, const std::string& name, const TokenSequence& values) const {
    dataset(group, name, name, {values.size()}, values.data());
  }
};

// The weights of one attention kind for every layer, [layers, heads, Lq, Lk] (a batch of
// one sentence: attention_weights gives [1, heads, Lq, Lk] per layer).
std::vector<float> all_layers(Transformer& model, Transformer::AttentionKind kind) {
  std::vector<float> weights;
  for (int layer = 0; layer < model.config().layers; ++layer) {
    const std::vector<float> one = model.attention_weights(kind, layer);
    weights.insert(weights.end(), one.begin(), one.end());
  }
  return weights;
}

void write_line(const DumpWriter& writer, hid_t root, const AttentionDump& dump) {
  const std::string name = "line_" + std::to_string(dump.line);
  const Handle group = writer.group(root, name.c_str());
  const hid_t g = group.get();
  writer.integer_attribute(g, "line", static_cast<int64_t>(dump.line));
  const hsize_t L = dump.layers, h = dump.heads;
  const hsize_t S = dump.source_ids.size(), T = dump.target_ids.size();
  THPC_CHECK(dump.source_tokens.size() == S && dump.target_tokens.size() == T,
             name << ": " << dump.source_tokens.size() << " and " << dump.target_tokens.size()
                  << " token strings for " << S << " and " << T << " ids");
  writer.strings(g, "source_text", {dump.source_text}, {});
  writer.strings(g, "target_text", {dump.target_text}, {});
  writer.strings(g, "source_tokens", dump.source_tokens, {S});
  writer.strings(g, "target_tokens", dump.target_tokens, {T});
  writer.ids(g, "source_ids", dump.source_ids);
  writer.ids(g, "target_ids", dump.target_ids);
  writer.floats(g, "encoder_self", dump.encoder_self, {L, h, S, S});
  writer.floats(g, "decoder_self", dump.decoder_self, {L, h, T, T});
  writer.floats(g, "cross", dump.cross, {L, h, T, S});
}

}  // namespace

AttentionDump capture_attention(Transformer& model, const TokenSequence& source,
                                const TokenSequence& output, const SpecialIds& ids) {
  const Batch batch = make_batch({source}, {output}, ids);
  model.evaluate(batch);
  AttentionDump dump;
  dump.source_ids.assign(batch.src.begin(), batch.src.end());
  dump.target_ids.assign(batch.tgt_in.begin(), batch.tgt_in.end());
  dump.layers = model.config().layers;
  dump.heads = model.config().heads;
  dump.encoder_self = all_layers(model, Transformer::AttentionKind::EncoderSelf);
  dump.decoder_self = all_layers(model, Transformer::AttentionKind::DecoderSelf);
  dump.cross = all_layers(model, Transformer::AttentionKind::Cross);
  return dump;
}

void write_attention_dumps(const std::string& path, const std::vector<AttentionDump>& dumps,
                           const std::string& checkpoint, OutputClaim* claim) {
  THPC_CHECK(!dumps.empty(), "no attention dumps to write to " << path);
  const DumpWriter writer(path);
  write_atomically(path, "attention dump " + path, [&](const std::string& temporary) {
    Handle file = writer.create_file(temporary);
    writer.integer_attribute(file.get(), "format_version", kAttentionDumpFormatVersion);
    writer.integer_attribute(file.get(), "layers", static_cast<int64_t>(dumps.front().layers));
    writer.integer_attribute(file.get(), "heads", static_cast<int64_t>(dumps.front().heads));
    writer.string_attribute(file.get(), "checkpoint", checkpoint);
    for (const AttentionDump& dump : dumps) write_line(writer, file.get(), dump);
    writer.check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "flush");
    writer.check(file.close(), "close");
  }, claim);
}

}  // namespace thpc
