#!/usr/bin/env bash
# Fetches the public data sets the examples and tests use, from where they are published,
# checks them against the sha256 sums the tests were written against, and writes them as
#   DIR/multi30k  DIR/wmt14_test  DIR/wmt14_train  DIR/ptb_sample  DIR/evalb  DIR/sacrebleu_tests
# Tests and examples then find them through THPC_DATA=DIR (tests/data_dir.h); a test whose
# data is absent is reported skipped with this command in its reason.
#
#   bash tools/fetch_data.sh NAME|all DIR       download, verify, move into place
#   bash tools/fetch_data.sh --verify NAME DIR  only check an existing DIR/NAME
#
# Sources (each pinned to a commit, so the bytes cannot drift):
#   multi30k        Multi30k task 1 EN-DE raw text (Elliott et al. 2016), github.com/multi30k/dataset,
#                   data/task1/raw/{train,val,test_2016_flickr}.{en,de}.gz, gunzipped.
#                   Non-commercial research/education use (Flickr terms).
#   wmt14_test      newstest2014 (full, 3003 lines) and newstest2013, EN-DE plain text, from
#                   github.com/Helsinki-NLP/OPUS-MT-testsets (testsets/en-de).
#   ptb_sample      NLTK's 10% Penn Treebank WSJ sample (wsj_0001-0199.mrg, 3,914 trees),
#                   github.com/nltk/nltk_data packages/corpora/treebank.zip, combined/ only.
#                   (C) LDC 1995, non-commercial use only.
#   evalb           EVALB's parameter files and test vectors (public domain), from the copy in
#                   github.com/nikitakit/self-attentive-parser (EVALB/).
#   sacrebleu_tests sacreBLEU's test vectors (Apache-2.0), github.com/mjpost/sacrebleu: the 16
#                   WMT17 EN-DE systems unpickled from test/wmt17_en_de_systems.pkl.bz2, the
#                   strings of test/test_bleu.py and test/test_sentence_bleu.py, and
#                   newstest2017 source/reference from OPUS-MT-testsets. Not fetched:
#                   SCORES.tsv (sacreBLEU's n-gram counts per system, computed once with
#                   sacreBLEU 2.x); the two tests that read it skip without it.
#   wmt14_train     The paper's WMT 2014 EN-DE training data (Europarl v7, Common Crawl,
#                   News Commentary v9; ~4.5M pairs) from statmt.org. These archives carry
#                   no published checksum: the script checks the line counts instead and
#                   prints the archives' sha256 for your records.
set -euo pipefail

usage() {
  echo "usage: bash tools/fetch_data.sh [--verify] NAME|all DIR" >&2
  echo "  NAME: multi30k wmt14_test wmt14_train ptb_sample evalb sacrebleu_tests" >&2
  exit 2
}

verify_only=0
if [ "${1:-}" = "--verify" ]; then verify_only=1; shift; fi
[ $# -eq 2 ] || usage
name=$1
dest=$2

GITHUB=https://raw.githubusercontent.com
MULTI30K_COMMIT=a3d2e0d26b56f3846f66a952536ffed4e401d05a
OPUS_COMMIT=ac0f19c0be3cb4e0d9450fcb2d7a9847c4bdd180
NLTK_COMMIT=5db857e6f7df11eabb5e5665836db9ec8df07e28
EVALB_COMMIT=7b1da8fa406e50e3f25bc7dcab0a434965d0b73a
EVALB_HEAD=24435a156a64d7433829e9a500a81f46b7e58030
SACREBLEU_COMMIT=f615c7286d4d813370efb824d94fc2bfcd3a6b94

# sha256 of every file as the tests expect it (paths relative to DIR/NAME).
sums_multi30k() {
  cat <<'SUMS'
4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16  test_2016_flickr.de
399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182  test_2016_flickr.en
2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72  train.de
460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6  train.en
660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660  val.de
1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227  val.en
SUMS
}
sums_wmt14_test() {
  cat <<'SUMS'
d7ea35ab91ff3709e03ad9cb6bf5b4f2cc775cd2d72efd5254c4aec5e69663ca  newstest2013.de
ace268a1d9724ca76f6d8e5c720ffdc08f01bdce45630ed8b269dc7918e1c16e  newstest2013.en
ae5d110486bc33d7175e9e28c7d0051eb3e5fcd2166dd93371089852c091a20e  newstest2014.de
7294bccf2879a97b3706b95c9595f1459617a8ee7130d5d8581c910e69736971  newstest2014.en
SUMS
}
sums_evalb() {
  cat <<'SUMS'
33c35ea3c99a7ba29a060f9448163280297a03be4b5c53d388bdfaf5f5119ad7  COLLINS.prm
7e12e5df4bae12cb21581ba157ced20e1986a0508dd10d0e8a4ab9a4cf94e85c  LICENSE
f38ef24b2803b441991ff9d26476d439f6aec430892bef85b47e2bd84df4991e  README
b5a32b1641c87f2c432db0941631b191fb3ab03ec7b431918bc893e6680cab97  new.prm
8bfd07bdcb9ba8c7658631f414fc8096deab56f9f8a495b8ffb03e98c382b253  nk.prm
3b7231ccbf8941a034e544026227f4becdcb049c4e9924ce4f3ff184de8c30db  sample/sample.gld
5c53e7e1f6b3eaca4bfd1934b057b4c20cd7e544480c9ef930d2dbdaccd4bc69  sample/sample.prm
e6a23e23b807a37f512ed71d65ca0a4537ccd81e829347d558b049dc8439a5db  sample/sample.rsl
c3ee3805b983dc93ee7838153bbde4d2cfb7822be2eacb02d010376729ce62d1  sample/sample.tst
2219b1d72e11ea3c22cd29948a05ab40320b8125c5c6f2e4438c7b3c81b13382  bug/bug.gld
e47c2e2cc7d6dab8a8f50fc4a1aeb7a2dccd8f520e98caca02b6ab516f8c2129  bug/bug.rsl-new
05f981f1e21d7da21194d23b5ca10ae833766609592bda7a8755aac2a029b3ab  bug/bug.rsl-old
d3a49a810b999a7b42165d35812811f4dc00a952d56a13a473a3fe0642cf4b67  bug/bug.tst
SUMS
}
sums_sacrebleu_tests() {
  cat <<'SUMS'
30764396f5c62a2f38795f043c42e420e5e78346b0121539dc9996e4f6577cd1  small/readme_example.hyp
0a3876d2fcc19cc9d44180b9d29949ab578ae37d3909f82197d7101b5c0c1b84  small/readme_example.ref1
ff6975dd1bfb701ceb4f0f090d16cd5d72e5e4afc1a6de6b7d420264b20bdfad  small/readme_example.ref2
e8f0860d5290e46bde53e137ee7aae2d157f28a859f3139aa776113ba893d467  small/sentence_ro.hyp
48813c1c396162b6f5852545f26a5649b3dc99f767127e1af77f010f16ebe02e  small/sentence_ro.ref
ebf393cb15a404f98964e07e764078ffca0064988dc144bd231c4329cb24b39e  small/sentence_zero.hyp
41eb19d483bd946cfb51af9cae1596b534d9f5a7be1e431cc18b54d5daa5aebd  small/sentence_zero.ref
675e4f7e6045dacf56507e29b24106d771a571e0eb58d822806b086cdcf892f4  wmt17_en-de/newstest2017-ende-ref.de
11adaec47477928dab9cb3fc9279d99dbbbfec7161f3abf6fddd759668fcd703  wmt17_en-de/newstest2017-ende-src.en
4e9dd45be7acff23bfa73924bb58a11805ec1aeac736d67ff2f579f31dbf3098  wmt17_en-de/newstest2017.C-3MA.4959.en-de
673834116488cbbb85e220b114e860a16fe17cf9b9b8700265a415118c9a4a00  wmt17_en-de/newstest2017.FBK.4870.en-de
dfdb5a8f1b00e667e73adcfd6cc550a7eaa4daaf719a0a14f828842e443a1041  wmt17_en-de/newstest2017.KIT.4950.en-de
64f711263e89b11cdfc9cd6bd0ca456574ef090d5b6f2f5c07c317203f90da70  wmt17_en-de/newstest2017.LIUM-NMT.4900.en-de
4f60d47c19112f486a0f620da42f49832ed743799997d04b1225e634c01b308c  wmt17_en-de/newstest2017.LMU-nmt-reranked.4934.en-de
fec897a87ffec1204d02027c68686cc54e06ec6af1eeec0cbeb2962f6b6036c2  wmt17_en-de/newstest2017.LMU-nmt-single.4893.en-de
df8ae4a531545f46fe35f65fb8ba91bd951c82eb8e1f18395309f0e0d449c116  wmt17_en-de/newstest2017.PROMT-Rule-based.4735.en-de
7ed98583bec977497f24e13d6291875d7e431f9da58597df7c57fa8739eaddf0  wmt17_en-de/newstest2017.RWTH-nmt-ensemble.4921.en-de
148580cc6c10db18fc6dcbacfd3300cf6f4e4ae6d5bbb0c2567cce6d7ec7b5b2  wmt17_en-de/newstest2017.SYSTRAN.4847.en-de
f053ce0b18531e044fd3eca0fcd48e5240410157812f096a914cf354054f67da  wmt17_en-de/newstest2017.TALP-UPC.4834.en-de
a309457e96f96cff3ead15a90bb06a5f71800a3e5d16ba984bf66952a8f2fa14  wmt17_en-de/newstest2017.online-A.0.en-de
6ab3065c76b7aafa86563ac1472a80aeae7c5e06286c3d3a45e411272b63820b  wmt17_en-de/newstest2017.online-B.0.en-de
56f34e965e048d4f2d61a0c819dded5a82a4f6e525cf5b216cdfe921bcb4434c  wmt17_en-de/newstest2017.online-F.0.en-de
128a148812da64f19756f6bce29518c35312a85f86cc541bfff6fa796e77ce7e  wmt17_en-de/newstest2017.online-G.0.en-de
d04c4cf6c0830ca4062fa38c8ef0e3e64156d81f7b11a191cfdcf0762732ec60  wmt17_en-de/newstest2017.uedin-nmt.4722.en-de
b935f6b8d7aa8ea775d45b4c2b4d950ab226bed80819fcffba98d0a9751f7dce  wmt17_en-de/newstest2017.xmu.4910.en-de
SUMS
}
# The 199 .mrg files are checked as one stream, `cat combined/wsj_*.mrg`, in name order.
PTB_CONCATENATED_SHA256=f018900543fbff4571439fd5e5ebdae00ba53dfdd6543e48491230d76d0e06a1
PTB_ZIP_SHA256=9da92d76c3666cfb6cddeaed0f7e86b344cce0f0928a286d439e555f19c37399

fail() { echo "fetch_data: $*" >&2; exit 1; }

download() {  # URL FILE
  echo "fetch_data: $1"
  if command -v curl >/dev/null; then
    curl -fsSL --retry 3 -o "$2" "$1" || fail "download failed: $1"
  else
    python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
      "$1" "$2" || fail "download failed: $1"
  fi
}

# Checks DIR/NAME against its sums; prints what differs.
verify() {  # NAME FOLDER
  local set=$1 folder=$2
  [ -d "$folder" ] || fail "$folder does not exist"
  case $set in
    ptb_sample)
      local got
      got=$(cat "$folder"/combined/wsj_*.mrg | sha256sum | cut -d' ' -f1)
      [ "$got" = "$PTB_CONCATENATED_SHA256" ] ||
        fail "$folder/combined/wsj_*.mrg: sha256 $got, expected $PTB_CONCATENATED_SHA256"
      ;;
    wmt14_train)
      local file lines expected
      for pair in europarl-v7.de-en:1920209 commoncrawl.de-en:2399123 news-commentary-v9.de-en:201288; do
        file=${pair%%:*}; expected=${pair##*:}
        for lang in en de; do
          lines=$(wc -l < "$folder/$file.$lang")
          [ "$lines" -eq "$expected" ] || fail "$folder/$file.$lang: $lines lines, expected $expected"
        done
      done
      ;;
    *)
      (cd "$folder" && "sums_$set" | sha256sum --quiet -c -) ||
        fail "$folder: files differ from the expected sha256 (listed above)"
      ;;
  esac
  echo "fetch_data: $folder verified"
}

fetch_multi30k() {  # WORK
  for split in train val test_2016_flickr; do
    for lang in en de; do
      download "$GITHUB/multi30k/dataset/$MULTI30K_COMMIT/data/task1/raw/$split.$lang.gz" "$1/$split.$lang.gz"
      gunzip "$1/$split.$lang.gz"
    done
  done
}

fetch_wmt14_test() {
  for file in newstest2014.en newstest2014.de newstest2013.en newstest2013.de; do
    download "$GITHUB/Helsinki-NLP/OPUS-MT-testsets/$OPUS_COMMIT/testsets/en-de/$file" "$1/$file"
  done
}

fetch_ptb_sample() {
  download "$GITHUB/nltk/nltk_data/$NLTK_COMMIT/packages/corpora/treebank.zip" "$1/treebank.zip"
  echo "$PTB_ZIP_SHA256  $1/treebank.zip" | sha256sum --quiet -c - || fail "treebank.zip: wrong sha256"
  download "$GITHUB/nltk/nltk_data/$NLTK_COMMIT/packages/corpora/treebank.xml" "$1/nltk_treebank_package.xml"
  python3 - "$1" <<'PY'
import os, sys, zipfile
work = sys.argv[1]
os.makedirs(os.path.join(work, "combined"))
with zipfile.ZipFile(os.path.join(work, "treebank.zip")) as archive:
    for member in archive.namelist():
        if member.startswith("treebank/combined/") and not member.endswith("/"):
            with open(os.path.join(work, "combined", os.path.basename(member)), "wb") as out:
                out.write(archive.read(member))
PY
  rm "$1/treebank.zip"
}

fetch_evalb() {
  local base="$GITHUB/nikitakit/self-attentive-parser/$EVALB_COMMIT/EVALB"
  mkdir -p "$1/sample" "$1/bug"
  for file in COLLINS.prm new.prm LICENSE README sample/sample.prm sample/sample.gld \
              sample/sample.tst sample/sample.rsl bug/bug.gld bug/bug.tst bug/bug.rsl-new bug/bug.rsl-old; do
    download "$base/$file" "$1/$file"
  done
  download "$GITHUB/nikitakit/self-attentive-parser/$EVALB_HEAD/EVALB/nk.prm" "$1/nk.prm"
}

fetch_sacrebleu_tests() {
  local base="$GITHUB/mjpost/sacrebleu/$SACREBLEU_COMMIT/test"
  mkdir -p "$1/small" "$1/wmt17_en-de"
  download "$base/wmt17_en_de_systems.pkl.bz2" "$1/systems.pkl.bz2"
  download "$base/test_bleu.py" "$1/test_bleu.py"
  download "$base/test_sentence_bleu.py" "$1/test_sentence_bleu.py"
  download "$GITHUB/Helsinki-NLP/OPUS-MT-testsets/$OPUS_COMMIT/testsets/en-de/newstest2017.de" \
    "$1/wmt17_en-de/newstest2017-ende-ref.de"
  download "$GITHUB/Helsinki-NLP/OPUS-MT-testsets/$OPUS_COMMIT/testsets/en-de/newstest2017.en" \
    "$1/wmt17_en-de/newstest2017-ende-src.en"
  # The pickle is a list of (name, [lines]); the test files' strings are plain literals,
  # read with ast (nothing of them is executed).
  python3 - "$1" <<'PY'
import ast, bz2, os, pickle, sys
work = sys.argv[1]
def write(path, lines):
    with open(os.path.join(work, path), "w", encoding="utf-8", newline="\n") as out:
        out.write("".join(line + "\n" for line in lines))
with bz2.BZ2File(os.path.join(work, "systems.pkl.bz2")) as archive:
    for system, lines in pickle.load(archive):
        if system.startswith("newstest2017."):
            write(os.path.join("wmt17_en-de", system), lines)
def literals(path):
    with open(os.path.join(work, path), encoding="utf-8") as source:
        tree = ast.parse(source.read())
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, (ast.Constant, ast.List))
            and node.targets[0].id in ("_refs", "_hyps", "REF", "SYS", "REF_0", "SYS_0")}
corpus = literals("test_bleu.py")
write("small/readme_example.hyp", corpus["_hyps"])
write("small/readme_example.ref1", corpus["_refs"][0])
write("small/readme_example.ref2", corpus["_refs"][1])
sentence = literals("test_sentence_bleu.py")
write("small/sentence_ro.hyp", [sentence["SYS"]])
write("small/sentence_ro.ref", [sentence["REF"]])
write("small/sentence_zero.hyp", [sentence["SYS_0"]])
write("small/sentence_zero.ref", [sentence["REF_0"]])
PY
  rm "$1/systems.pkl.bz2" "$1/test_bleu.py" "$1/test_sentence_bleu.py"
}

fetch_wmt14_train() {
  download http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz "$1/europarl.tgz"
  download http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz "$1/commoncrawl.tgz"
  download http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz "$1/nc-v9.tgz"
  sha256sum "$1"/*.tgz
  for archive in "$1"/*.tgz; do tar -xzf "$archive" -C "$1"; done
  find "$1" -name 'europarl-v7.de-en.*' -o -name 'commoncrawl.de-en.*' -o -name 'news-commentary-v9.de-en.*' |
    while read -r file; do mv "$file" "$1/"; done
  rm -rf "$1"/*.tgz "$1"/training*
}

one() {  # NAME
  local set=$1
  declare -F "fetch_$set" >/dev/null || usage
  if [ $verify_only = 1 ]; then verify "$set" "$dest/$set"; return; fi
  if [ -e "$dest/$set" ]; then
    echo "fetch_data: $dest/$set exists; checking it"
    verify "$set" "$dest/$set"
    return
  fi
  mkdir -p "$dest"
  local work="$dest/.$set.partial"
  rm -rf "$work"
  mkdir -p "$work"
  "fetch_$set" "$work"
  verify "$set" "$work"
  mv "$work" "$dest/$set"  # only a verified set gets the name tests look for
  echo "fetch_data: $dest/$set ready; use it with THPC_DATA=$dest"
}

if [ "$name" = all ]; then
  for set in multi30k wmt14_test ptb_sample evalb sacrebleu_tests; do one "$set"; done
  echo "fetch_data: wmt14_train (~1.5 GB) is fetched only when named"
else
  one "$name"
fi
