#!/usr/bin/env bash
# Fetches the public data sets the examples and tests use, from where they are published,
# checks them against the sha256 sums the tests were written against, and writes them as
#   DIR/multi30k  DIR/wmt14_test  DIR/ptb_sample  DIR/evalb  DIR/sacrebleu_tests
#   DIR/wmt14  DIR/wmt14_enfr     (the paper's training data, several GB: only when named)
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
#   wmt14           The paper's WMT 2014 EN-DE data (§5.1), laid out for transformer_preprocess
#                   (docs/wmt14.md): train.{en,de} = Europarl v7, Common Crawl and News
#                   Commentary v9 de-en, concatenated in that order (fairseq's
#                   prepare-wmt14en2de.sh --icml17 and tensor2tensor take the same three),
#                   4,520,620 lines; valid.{en,de} = newstest2013, test.{en,de} = newstest2014
#                   (the wmt14_test files above). The three archives from statmt.org are
#                   checked against the sha256 and size that TensorFlow Datasets records for
#                   them (url_checksums/wmt14_translate.txt; Europarl's and Common Crawl's also
#                   published independently), each extracted part against its line count.
#                   Download ~1.7 GB, ~1.3 GB kept. Research use; the corpora's own terms apply.
#   wmt14_enfr      The paper's WMT 2014 EN-FR data (§5.1, 36M sentences): train.{en,fr} = Europarl
#                   v7, Common Crawl, UN, News Commentary v9 and Gigaword fr-en (the WMT14
#                   task's parallel data, as fairseq's prepare-wmt14en2fr.sh takes it); valid =
#                   newstest2013 and test = newstest2014 (full, 3003 lines) from the WMT19 dev
#                   archive, newstest2014 out of its SGML as Moses' input-from-sgm.perl reads
#                   it. Archives checked against TensorFlow Datasets' sha256 and sizes
#                   (wmt14/wmt15_translate.txt, wmt19 dev.tgz); the parts by equal line counts
#                   of both sides, the test sets by their line counts (no published sums of
#                   the extracted text). Download ~6.7 GB. Written from the sources' documented
#                   layout; never run here (no network): report what fails.
set -euo pipefail

# usage [CODE]: 2 (a bad command line, to standard error) unless asked for (--help: 0, to
# standard output).
usage() {
  local code=${1:-2}
  {
    echo "usage: bash tools/fetch_data.sh [--verify] NAME|all DIR"
    echo "  NAME: multi30k wmt14_test ptb_sample evalb sacrebleu_tests wmt14 wmt14_enfr"
  } >&"$([ "$code" = 0 ] && echo 1 || echo 2)"
  exit "$code"
}

verify_only=0
case ${1:-} in -h | --help) usage 0 ;; esac
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
    wmt14|wmt14_enfr)
      verify_wmt14 "$set" "$folder"
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

# ---- WMT14 training data ----
# URL, size in bytes, sha256 (TensorFlow Datasets' url_checksums/wmt14_translate.txt and
# wmt15_translate.txt; Europarl's and Common Crawl's sums appear in other public scripts too).
WMT14_EUROPARL="http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz 657632379 0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7"
WMT14_COMMONCRAWL="http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz 918311367 c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5"
WMT14_NEWS_COMMENTARY="http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz 80418416 cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485"
WMT14_UN="http://www.statmt.org/wmt13/training-parallel-un.tgz 2365634246 29141b5c1eba149a94f7a59d3b1a834b2e47fe0f8758d68dcd77a3d3f497ee47"
WMT14_GIGA_FREN="http://www.statmt.org/wmt10/training-giga-fren.tar 2595102720 3ff8319f6919393520559bfbc7ad6a747ec81b3abc7be9993b338d4b017b4d9a"
WMT19_DEV="http://data.statmt.org/wmt19/translation-task/dev.tgz 38654961 7a7deccf82ebb05ba508dba5eb21356492224e8f630ec4f992132b029b4b25e7"
# The EN-DE parts and their line counts (each side; the sum is train's 4,520,620).
WMT14_ENDE_PARTS="europarl-v7.de-en:1920209 commoncrawl.de-en:2399123 news-commentary-v9.de-en:201288"
WMT14_ENDE_LINES=4520620

# Downloads one "URL SIZE SHA256" archive to FILE and checks it.
download_archive() {  # "URL SIZE SHA256" FILE
  local url size sum
  read -r url size sum <<< "$1"
  download "$url" "$2"
  local got_size got_sum
  got_size=$(stat -c %s "$2")
  [ "$got_size" = "$size" ] || fail "$url: $got_size bytes, expected $size"
  got_sum=$(sha256sum "$2" | cut -d' ' -f1)
  [ "$got_sum" = "$sum" ] || fail "$url: sha256 $got_sum, expected $sum"
}

# Appends FILE to OUT, adding the newline a last line may lack (so that no two lines of
# neighbouring parts merge).
append_lines() {  # FILE OUT
  cat "$1" >> "$2"
  [ -z "$(tail -c 1 "$1")" ] || echo >> "$2"
}

# The lines of both sides of a parallel part must agree (and equal EXPECTED when given);
# a last line without its newline counts (awk's records, not wc's newlines).
check_pair() {  # PREFIX SRC TGT [EXPECTED]
  local src_lines tgt_lines
  src_lines=$(awk 'END { print NR }' "$1.$2")
  tgt_lines=$(awk 'END { print NR }' "$1.$3")
  [ "$src_lines" = "$tgt_lines" ] || fail "$1: $src_lines $2 lines, $tgt_lines $3 lines"
  [ -z "${4:-}" ] || [ "$src_lines" = "$4" ] || fail "$1.$2: $src_lines lines, expected $4"
}

fetch_wmt14() {
  local work=$1 part
  download_archive "$WMT14_EUROPARL" "$work/europarl.tgz"
  download_archive "$WMT14_COMMONCRAWL" "$work/commoncrawl.tgz"
  download_archive "$WMT14_NEWS_COMMENTARY" "$work/nc-v9.tgz"
  tar -xzf "$work/europarl.tgz" -C "$work" training/europarl-v7.de-en.en training/europarl-v7.de-en.de
  tar -xzf "$work/commoncrawl.tgz" -C "$work" commoncrawl.de-en.en commoncrawl.de-en.de
  tar -xzf "$work/nc-v9.tgz" -C "$work" training/news-commentary-v9.de-en.en training/news-commentary-v9.de-en.de
  rm "$work"/*.tgz
  mv "$work"/training/* "$work"/ && rmdir "$work/training"
  : > "$work/train.en"
  : > "$work/train.de"
  for part in $WMT14_ENDE_PARTS; do
    check_pair "$work/${part%%:*}" en de "${part##*:}"
    append_lines "$work/${part%%:*}.en" "$work/train.en"
    append_lines "$work/${part%%:*}.de" "$work/train.de"
    rm "$work/${part%%:*}".{en,de}
  done
  # Dev and test: the sha256-pinned newstest2013/2014 of wmt14_test.
  mkdir "$work/newstest"
  fetch_wmt14_test "$work/newstest"
  (cd "$work/newstest" && sums_wmt14_test | sha256sum --quiet -c -) ||
    fail "newstest2013/2014 differ from the expected sha256"
  for lang in en de; do
    mv "$work/newstest/newstest2013.$lang" "$work/valid.$lang"
    mv "$work/newstest/newstest2014.$lang" "$work/test.$lang"
  done
  rmdir "$work/newstest"
  (cd "$work" && sha256sum train.* valid.* test.* > SHA256SUMS)
}

# newstest SGML to text as Moses' input-from-sgm.perl does: the text of each <seg>, runs of
# ASCII whitespace made one space, trimmed (on bytes, as the Perl script reads them).
sgm_to_text() {  # IN.sgm OUT
  python3 - "$1" "$2" <<'PY'
import re, sys
data = open(sys.argv[1], "rb").read()
segments = re.findall(rb"<seg[^>]+>\s*(.*?)\s*</seg>", data, flags=re.IGNORECASE | re.DOTALL)
with open(sys.argv[2], "wb") as out:
    for segment in segments:
        out.write(re.sub(rb"\s+", b" ", segment).strip(b" ") + b"\n")
PY
}

fetch_wmt14_enfr() {
  local work=$1 part
  download_archive "$WMT14_EUROPARL" "$work/europarl.tgz"
  download_archive "$WMT14_COMMONCRAWL" "$work/commoncrawl.tgz"
  download_archive "$WMT14_UN" "$work/un.tgz"
  download_archive "$WMT14_NEWS_COMMENTARY" "$work/nc-v9.tgz"
  download_archive "$WMT14_GIGA_FREN" "$work/giga-fren.tar"
  download_archive "$WMT19_DEV" "$work/dev.tgz"
  tar -xzf "$work/europarl.tgz" -C "$work" training/europarl-v7.fr-en.en training/europarl-v7.fr-en.fr
  tar -xzf "$work/commoncrawl.tgz" -C "$work" commoncrawl.fr-en.en commoncrawl.fr-en.fr
  tar -xzf "$work/un.tgz" -C "$work" un/undoc.2000.fr-en.en un/undoc.2000.fr-en.fr
  tar -xzf "$work/nc-v9.tgz" -C "$work" training/news-commentary-v9.fr-en.en training/news-commentary-v9.fr-en.fr
  tar -xf "$work/giga-fren.tar" -C "$work" giga-fren.release2.fixed.en.gz giga-fren.release2.fixed.fr.gz
  gunzip "$work"/giga-fren.release2.fixed.{en,fr}.gz
  # newstest2014 under the names TensorFlow Datasets reads from this archive (fr-en: the
  # French source, the English reference). The full set is both translation directions'
  # documents, so its French and English sides are EN-FR's reference and source alike.
  tar -xzf "$work/dev.tgz" -C "$work" dev/newstest2013.en dev/newstest2013.fr \
    dev/newstest2014-fren-src.fr.sgm dev/newstest2014-fren-ref.en.sgm
  rm "$work"/*.tgz "$work/giga-fren.tar"
  : > "$work/train.en"
  : > "$work/train.fr"
  for part in training/europarl-v7.fr-en commoncrawl.fr-en un/undoc.2000.fr-en \
              training/news-commentary-v9.fr-en giga-fren.release2.fixed; do
    check_pair "$work/$part" en fr
    append_lines "$work/$part.en" "$work/train.en"
    append_lines "$work/$part.fr" "$work/train.fr"
    rm "$work/$part".{en,fr}
  done
  mv "$work/dev/newstest2013.en" "$work/valid.en"
  mv "$work/dev/newstest2013.fr" "$work/valid.fr"
  sgm_to_text "$work/dev/newstest2014-fren-ref.en.sgm" "$work/test.en"
  sgm_to_text "$work/dev/newstest2014-fren-src.fr.sgm" "$work/test.fr"
  rm -rf "${work:?}/dev" "$work/training" "$work/un"
  (cd "$work" && sha256sum train.* valid.* test.* > SHA256SUMS)
}

# The prepared folder: line counts (train both sides equal, valid 3000, test 3003; EN-DE's
# train 4,520,620 and its newstest files by their pinned sha256), then the SHA256SUMS the
# fetch recorded, which catches any later change.
verify_wmt14() {  # NAME FOLDER
  local set=$1 folder=$2 target=de
  [ "$set" = wmt14_enfr ] && target=fr
  local expected_train=""
  [ "$set" = wmt14 ] && expected_train=$WMT14_ENDE_LINES
  check_pair "$folder/train" en "$target" "$expected_train"
  check_pair "$folder/valid" en "$target" 3000
  check_pair "$folder/test" en "$target" 3003
  [ -f "$folder/SHA256SUMS" ] || fail "$folder/SHA256SUMS is missing"
  (cd "$folder" && sha256sum --quiet -c SHA256SUMS) ||
    fail "$folder: files changed since they were fetched (SHA256SUMS)"
  if [ "$set" = wmt14 ]; then
    local pinned
    pinned=$(sums_wmt14_test | sed -e 's/newstest2013/valid/' -e 's/newstest2014/test/')
    (cd "$folder" && sha256sum --quiet -c - <<< "$pinned") ||
      fail "$folder: valid/test differ from the pinned newstest2013/2014"
  fi
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
  # A fetch that fails (no network, a bad checksum) leaves nothing behind; a later run
  # starts afresh anyway.
  # shellcheck disable=SC2064  # (the path now, quoted: $work is local)
  trap "rm -rf $(printf %q "$work")" EXIT
  "fetch_$set" "$work"
  verify "$set" "$work"
  mv "$work" "$dest/$set"  # only a verified set gets the name tests look for
  trap - EXIT
  echo "fetch_data: $dest/$set ready; use it with THPC_DATA=$dest"
}

if [ "$name" = all ]; then
  for set in multi30k wmt14_test ptb_sample evalb sacrebleu_tests; do one "$set"; done
  echo "fetch_data: wmt14 (~1.7 GB download) and wmt14_enfr (~6.7 GB) are fetched only when named"
else
  one "$name"
fi
