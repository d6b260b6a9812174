// The Penn Treebank reader (src/parse/tree): any bytes as an .mrg file. Every tree it
// reads must come back from its linearization and words exactly (the parser's target
// sequences lose nothing), and the same bytes read as a decoder's output sequence are
// repaired into a tree without an error.
#include <sstream>

#include "fuzz_target.h"
#include "parse/tree.h"

namespace {

bool same_tree(const thpc::parse::TreeNode& a, const thpc::parse::TreeNode& b) {
  if (a.label != b.label || a.word != b.word || a.children.size() != b.children.size()) {
    return false;
  }
  for (size_t i = 0; i < a.children.size(); ++i) {
    if (!same_tree(a.children[i], b.children[i])) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace thpc;
  using namespace thpc::parse;
  const std::string text(fuzz::bytes_of(data, size));
  fuzz::refused_or_read([&] {
    std::istringstream in(text);
    for (const TreeNode& tree : read_ptb_trees(in, "fuzz.mrg")) {
      TreeNode normalized;
      if (!normalize_tree(tree, &normalized) || normalized.is_preterminal()) continue;
      to_evalb_line(normalized);
      const std::string sequence = linearize(normalized);
      const Delinearized back = delinearize(sequence, words_of(normalized), tags_of(normalized));
      fuzz::require(back.how == Reconstruction::kWellFormed && same_tree(back.tree, normalized),
                    "the tree does not come back from " + sequence);
    }
  });
  const Delinearized repaired = delinearize(text, {"a", "b", "c"}, {"DT", "NN", "."});
  fuzz::require(words_of(repaired.tree).size() == 3, "every word in the repaired tree");
  return 0;
}
