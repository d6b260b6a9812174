#!/usr/bin/env python3
"""Converts a transformer_hpc checkpoint into a CTranslate2 model directory, so that
CTranslate2 decodes the same weights transformer_decode does.

  tools/convert_to_ctranslate2.py --checkpoint FILE.h5 --output_dir DIR
                                  [--quantization TYPE] [--force]

DIR gets CTranslate2's model.bin, config.json and shared_vocabulary.json, the
checkpoint's SentencePiece model as spm.model, and thpc_model.json (the checkpoint's
path, step and architecture: tools/translate_ctranslate2.py reads max_positions there).
A model of separate vocabularies (transformer_preprocess --source-vocab-size) gets
source_vocabulary.json and target_vocabulary.json instead, the target's SentencePiece
model as spm.model and the source's as spm.source.model, as transformer_preprocess names
them. Translate with it as with any CTranslate2 model, the source as SentencePiece
pieces (of spm.source.model where there is one; CTranslate2 appends </s> to the source
itself, as transformer_decode does):

  import ctranslate2, sentencepiece
  sp = sentencepiece.SentencePieceProcessor(model_file="DIR/spm.model")
  source_sp = sp  # separate vocabularies: SentencePieceProcessor(model_file="DIR/spm.source.model")
  translator = ctranslate2.Translator("DIR")
  result = translator.translate_batch([source_sp.encode("A dog runs.", out_type=str)],
                                      beam_size=4, min_decoding_length=0)
  print(sp.decode(result[0].hypotheses[0]))

or with tools/translate_ctranslate2.py, which sets what transformer_decode does.

What maps to what (our names: src/model/transformer.cc; CTranslate2's:
ctranslate2/specs/transformer_spec.py):
  embed.weight [V, d]              encoder and decoder embeddings and the output projection
                                   (one matrix, tied as in §3.4; CTranslate2 stores it once);
                                   both scale by sqrt(d_model) (scale_embeddings)
  src_embed.weight [V_src, d]      with separate vocabularies, the encoder's embeddings
                                   (embed.weight then the decoder's and the projection)
  positions                        position_encodings.encodings of both stacks: our
                                   sinusoid table (PE(pos, 2i) = sin, PE(pos, 2i+1) = cos,
                                   computed in double as kernels/positions.cc does, then
                                   rounded to fp32) or the learned embed.positions
  self_attn.qkv.weight [d, 3hd_k]  self_attention.linear[0] (fused Q|K|V, transposed: our
                                   linears are y = x W with W [in, out], CTranslate2's
                                   weights are [out, in])
  self_attn.out                    self_attention.linear[1]
  cross_attn.q, .kv, .out          attention.linear[0], [1] (fused K|V), [2]
  norm1, norm2 (, norm3)           the layer norm after each residual: post-norm (§3.1),
                                   pre_norm = False, so no final stack norm
  ffn.fc1, ffn.fc2                 ffn.linear_0, linear_1; activation ReLU (§3.3)
  *.bias                           the bias; without model.attention_bias the attention
                                   projections have none and neither has their spec
  model.layernorm_eps              config.layer_norm_epsilon
The vocabulary is the SentencePiece model's pieces in id order, then the specials it
lacks (<pad>, <s>, </s>: a model of spm_train's defaults has no pad), as
src/data/sentencepiece_vocabulary.h adds them; its unk, bos and eos pieces give
CTranslate2's unk_token, bos_token (= decoder_start_token: our decoder starts from bos)
and eos_token (one unk and one eos for both vocabularies in CTranslate2's config, bos
the target's alone: with separate vocabularies the source's unk and eos must be spelt as
the target's, and its special ids must be the target's, as transformer_preprocess makes
them); add_source_eos makes CTranslate2's source what src/data/batch.cc
make_batch builds, the pieces then eos, no bos.

What CTranslate2 cannot represent is refused with one line (exit 1): d_k != d_v (it has
one head width); and model.norm = pre, not mapped yet. Needs numpy and h5py to read the checkpoint, sentencepiece for its
pieces and ctranslate2 to write the model (`bash tools/install_deps.sh --ctranslate2`
installs them into ~/.cache/thpc-venv). Exit codes: 0 done, 2 a bad command line or an
--output_dir it may not write, 1 an unreadable or unsupported checkpoint, or a missing
package.
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile

PROGRAM = "convert_to_ctranslate2.py"

try:
    import h5py
    import numpy as np
except ImportError as missing:
    sys.exit(f"{PROGRAM}: error: needs numpy and h5py ({missing}); "
             "bash tools/install_deps.sh installs them into ~/.cache/thpc-venv")

# docs/checkpoints.md "File header": 512 bytes before HDF5's, checked before HDF5 reads
# anything (HDF5 1.10 crashes on some damaged files).
HEADER_BYTES = 512
HEADER_MAGIC = b"thpc-checkpoint-file 1\n"


class ConversionError(Exception):
    """The checkpoint cannot be read or converted: exit code 1, one line."""
    exit_code = 1


class OutputDirRefused(ConversionError):
    """An --output_dir the conversion may not write, refused before any work: a usage
    error, exit code 2, as the C++ tools refuse their outputs."""
    exit_code = 2


class DivergedCheckpoint(ConversionError):
    """A checkpoint its run marked diverged (the header's "state diverged" line): refused as
    transformer_decode and transformer_quantize refuse it, exit code 2, a command line
    naming the wrong file."""
    exit_code = 2


def verify_header(path):
    """The size and sha256 the checkpoint's header records, as read_checkpoint checks;
    returns the header's state word (healthy, diverged or superseded)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as file:
            head = file.read(HEADER_BYTES)
            if not head.startswith(HEADER_MAGIC):
                if head.startswith(b"\x89HDF\r\n\x1a\n"):
                    raise ConversionError("an HDF5 file without a checkpoint header (written "
                                          "before checkpoints had one, or by another program)")
                raise ConversionError("not a transformer_hpc checkpoint (no checkpoint header)")
            fields = dict(line.split(" ", 1) for line in
                          head.rstrip(b"\0").decode("ascii", "replace").splitlines()[1:]
                          if " " in line)
            recorded_size = int(fields.get("bytes", "-1"))
            if recorded_size != size:
                raise ConversionError(f"the file is truncated or damaged (its header records "
                                      f"{recorded_size} bytes, the file has {size})")
            digest = hashlib.sha256()
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
    except OSError as error:
        raise ConversionError(error.strerror or str(error)) from None
    if digest.hexdigest() != fields.get("sha256", "").strip():
        raise ConversionError("bad checksum for the file: it is corrupt")
    return fields.get("state", "healthy").strip()


def parse_architecture(text):
    """'layers=6 d_model=512 ...' (checkpoint.cc architecture_text) as a dict."""
    fields = dict(item.split("=", 1) for item in text.split() if "=" in item)
    needed = ("layers", "d_model", "d_ff", "heads", "d_k", "d_v", "vocab_size", "positions",
              "max_positions", "attention_bias")
    absent = [key for key in needed if key not in fields]
    if absent:
        raise ConversionError(f"its architecture '{text}' lacks {', '.join(absent)}")
    # A field this converter does not know (a model.* key a later version records) changes
    # what the parameters compute in a way nothing below maps: refused rather than
    # converted as if it were absent (a helper's trial: a model.activation = gelu model
    # would have been converted with ReLU).
    unknown = sorted(set(fields) - set(needed) - {"norm", "source_vocab_size"})
    if unknown:
        raise ConversionError(f"its architecture '{text}' records "
                              f"{', '.join('model.' + key for key in unknown)}, which this "
                              "converter does not map")
    for key in needed:
        if key not in ("positions", "attention_bias"):
            fields[key] = int(fields[key])
    # Recorded only with separate vocabularies (architecture_text); 0: the target's serves
    # the source too.
    fields["source_vocab_size"] = int(fields.get("source_vocab_size", 0))
    fields["attention_bias"] = fields["attention_bias"] == "true"
    # Written before model.norm existed: the paper's post-norm.
    if fields.get("norm", "post") != "post":
        raise ConversionError(f"it holds a model.norm = {fields['norm']} model; this converter "
                              "maps post-norm models only (CTranslate2's pre_norm spec, with "
                              "its final layer norms, is not mapped yet)")
    return fields


def layernorm_eps(config_ini):
    """[model] layernorm_eps of the stored configuration (Config::to_ini), else the default."""
    section = None
    for line in config_ini.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == "model" and "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            if key == "layernorm_eps":
                return float(value)
    return 1e-5  # src/config/config.h


def sinusoid_table(max_positions, d_model):
    """kernels/positions.cc: angle = pos / 10000^(2i / d) in double, sin in column 2i and
    cos in 2i+1, rounded to fp32 (the model uploads the double table as float). math.*
    is the C library's, as std::sin/cos/pow are, so the rounding is the same."""
    table = np.empty((max_positions, d_model), dtype=np.float64)
    for col in range(d_model):
        denominator = math.pow(10000.0, 2.0 * (col // 2) / float(d_model))
        function = math.sin if col % 2 == 0 else math.cos
        for pos in range(max_positions):
            table[pos, col] = function(float(pos) / denominator)
    return table.astype(np.float32)


def read_checkpoint(path):
    """Architecture, layer-norm epsilon, parameters by name and the SentencePiece model."""
    if verify_header(path) == "diverged":
        raise DivergedCheckpoint("is marked diverged (its run judged its parameters "
                                 "diverged: a loss or gradient norm not finite or spiking, or "
                                 "a validation after it): converting it would give a broken "
                                 "model; take a healthy checkpoint (the newest healthy one of "
                                 "its directory, or best.h5)")
    try:
        with h5py.File(path, "r") as file:
            attrs = file.attrs

            def text(name):
                if name not in attrs:
                    raise ConversionError(f"no '{name}' attribute: not a checkpoint")
                value = attrs[name]
                return value.decode() if isinstance(value, bytes) else str(value)

            version = int(attrs.get("format_version", -1))
            if version == 2:
                raise ConversionError("a quantized checkpoint (transformer_quantize's int8): "
                                      "convert the float checkpoint it was made from, with "
                                      "--quantization int8 for CTranslate2's own int8")
            if version != 1:
                raise ConversionError(f"format_version {version}, this converter reads 1")
            architecture = parse_architecture(text("architecture"))
            architecture["text"] = text("architecture")
            eps = layernorm_eps(text("config"))
            if "params" not in file:
                raise ConversionError("no /params group: not a checkpoint")
            params = {name: np.asarray(dataset[()], dtype=np.float32)
                      for name, dataset in file["params"].items()}
            spm_model = file["spm_model"][()].tobytes() if "spm_model" in file else None
            # With separate vocabularies the source's (Checkpoint::source_spm_model).
            source_spm_model = (file["source_spm_model"][()].tobytes()
                                if "source_spm_model" in file else None)
            step = int(attrs.get("step", -1))
    except OSError as error:
        raise ConversionError(f"cannot be read by HDF5: {error}") from None
    architecture["step"] = step
    return architecture, eps, params, spm_model, source_spm_model


def expected_shapes(arch):
    """The parameter table of add_transformer_parameters (src/model/transformer.cc)."""
    d, d_ff, h = arch["d_model"], arch["d_ff"], arch["heads"]
    dk, dv, vocab = arch["d_k"], arch["d_v"], arch["vocab_size"]
    shapes = {"embed.weight": (vocab, d)}
    if arch["source_vocab_size"] > 0:
        shapes["src_embed.weight"] = (arch["source_vocab_size"], d)
    if arch["positions"] == "learned":
        shapes["embed.positions"] = (arch["max_positions"], d)

    def projection(name, rows, cols):
        shapes[name + ".weight"] = (rows, cols)
        if arch["attention_bias"]:
            shapes[name + ".bias"] = (1, cols)

    def norm(name):
        shapes[name + ".gamma"] = (1, d)
        shapes[name + ".beta"] = (1, d)

    def ffn(name):
        shapes.update({name + ".fc1.weight": (d, d_ff), name + ".fc1.bias": (1, d_ff),
                       name + ".fc2.weight": (d_ff, d), name + ".fc2.bias": (1, d)})

    for stack in ("encoder", "decoder"):
        for layer in range(arch["layers"]):
            p = f"{stack}.{layer}."
            projection(p + "self_attn.qkv", d, h * (2 * dk + dv))
            projection(p + "self_attn.out", h * dv, d)
            norm(p + "norm1")
            if stack == "decoder":
                projection(p + "cross_attn.q", d, h * dk)
                projection(p + "cross_attn.kv", d, h * (dk + dv))
                projection(p + "cross_attn.out", h * dv, d)
                norm(p + "norm2")
                ffn(p + "ffn")
                norm(p + "norm3")
            else:
                ffn(p + "ffn")
                norm(p + "norm2")
    return shapes


def check_parameters(arch, params):
    shapes = expected_shapes(arch)
    missing = sorted(set(shapes) - set(params))
    unexpected = sorted(set(params) - set(shapes))
    if missing or unexpected:
        raise ConversionError(
            "its parameters do not match its architecture: "
            + (f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}; "
               if missing else "")
            + (f"unexpected {', '.join(unexpected[:3])}{' ...' if len(unexpected) > 3 else ''}"
               if unexpected else ""))
    for name, shape in shapes.items():
        if params[name].shape != shape:
            raise ConversionError(f"parameter {name} has shape {list(params[name].shape)}, "
                                  f"its architecture makes it {list(shape)}")
    if arch["d_k"] != arch["d_v"]:
        raise ConversionError(f"d_k = {arch['d_k']} and d_v = {arch['d_v']} differ: "
                              "CTranslate2's attention has one head width")


def vocabulary(spm_model, vocab_size, side=""):
    """The pieces in id order, then the specials the model lacks, the special tokens
    (unk, bos, eos: their pieces) and the special ids (pad, unk, bos, eos).
    `side`: "source " for the source's model of separate vocabularies, in the messages."""
    try:
        import sentencepiece
    except ImportError as missing:
        raise ConversionError(f"needs the Python package sentencepiece ({missing}); "
                              "bash tools/install_deps.sh --ctranslate2 installs it") from None
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(spm_model)
    except RuntimeError as error:
        raise ConversionError(f"its {side}SentencePiece model cannot be loaded: "
                              f"{error}") from None
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    own = len(pieces)
    # The ids the model was trained with: a special the SentencePiece model lacks takes
    # the id after its pieces, pad before bos before eos (sentencepiece_vocabulary.h).
    ids = {"unk": processor.unk_id()}
    for name, token, present in (("pad", "<pad>", processor.pad_id()),
                                 ("bos", "<s>", processor.bos_id()),
                                 ("eos", "</s>", processor.eos_id())):
        ids[name] = present if present >= 0 else len(pieces)
        if present < 0:
            pieces.append(token)
    if len(pieces) != vocab_size:
        added = len(pieces) - own
        raise ConversionError(f"its {side}SentencePiece model has {own} pieces"
                              + (f" and {added} special ids after them" if added else "")
                              + f", the model a {side}vocabulary of {vocab_size}")
    if len(set(pieces)) != len(pieces):
        raise ConversionError(f"its {side}SentencePiece model has a piece twice")
    return pieces, {name: pieces[i] for name, i in ids.items() if name != "pad"}, ids


def build_spec(arch, eps, params, pieces, special, source_pieces=None):
    """`source_pieces`: the source's vocabulary when separate (None: `pieces` serve both)."""
    try:
        import ctranslate2
        from ctranslate2.specs import common_spec, transformer_spec
    except ImportError as missing:
        raise ConversionError(f"needs the Python package ctranslate2 ({missing}); "
                              "bash tools/install_deps.sh --ctranslate2 installs it") from None
    layers, heads, d = arch["layers"], arch["heads"], arch["d_model"]
    # CTranslate2 splits d_model evenly over the heads unless told the head width.
    head_dim = None if arch["d_k"] * heads == d else arch["d_k"]
    encoder = transformer_spec.TransformerEncoderSpec(
        layers, heads, pre_norm=False, activation=common_spec.Activation.RELU,
        head_dim=head_dim)
    decoder = transformer_spec.TransformerDecoderSpec(
        layers, heads, pre_norm=False, activation=common_spec.Activation.RELU,
        head_dim=head_dim)
    spec = transformer_spec.TransformerSpec(encoder, decoder)

    def linear(target, name):
        target.weight = np.ascontiguousarray(params[name + ".weight"].T)
        if name + ".bias" in params:
            target.bias = params[name + ".bias"].reshape(-1)

    def norm(target, name):
        target.gamma = params[name + ".gamma"].reshape(-1)
        target.beta = params[name + ".beta"].reshape(-1)

    embedding = params["embed.weight"]
    positions = (params["embed.positions"] if arch["positions"] == "learned"
                 else sinusoid_table(arch["max_positions"], d))
    encoder.embeddings[0].weight = params.get("src_embed.weight", embedding)
    decoder.embeddings.weight = embedding
    decoder.projection.weight = embedding  # logits = h E^T (§3.4), no bias
    encoder.position_encodings.encodings = positions
    decoder.position_encodings.encodings = positions
    def self_attention_and_ffn(layer_spec, p, ffn_norm):
        """What both stacks' layers have: self-attention + norm1, FFN + its norm."""
        linear(layer_spec.self_attention.linear[0], p + "self_attn.qkv")
        linear(layer_spec.self_attention.linear[1], p + "self_attn.out")
        norm(layer_spec.self_attention.layer_norm, p + "norm1")
        linear(layer_spec.ffn.linear_0, p + "ffn.fc1")
        linear(layer_spec.ffn.linear_1, p + "ffn.fc2")
        norm(layer_spec.ffn.layer_norm, p + ffn_norm)

    for layer in range(layers):
        self_attention_and_ffn(encoder.layer[layer], f"encoder.{layer}.", "norm2")
        p, g = f"decoder.{layer}.", decoder.layer[layer]
        self_attention_and_ffn(g, p, "norm3")
        linear(g.attention.linear[0], p + "cross_attn.q")
        linear(g.attention.linear[1], p + "cross_attn.kv")
        linear(g.attention.linear[2], p + "cross_attn.out")
        norm(g.attention.layer_norm, p + "norm2")

    config = spec.config
    config.layer_norm_epsilon = eps
    config.unk_token = special["unk"]
    config.bos_token = special["bos"]
    config.eos_token = special["eos"]
    config.decoder_start_token = special["bos"]
    config.add_source_bos = False
    config.add_source_eos = True
    spec.register_source_vocabulary(source_pieces or pieces)
    spec.register_target_vocabulary(pieces)
    return spec, ctranslate2.__version__


# What a conversion writes into output_dir (CTranslate2's files, of its versions, and
# ours): all --force may replace.
MODEL_FILES = {"config.json", "model.bin", "shared_vocabulary.json", "shared_vocabulary.txt",
               "source_vocabulary.json", "source_vocabulary.txt", "target_vocabulary.json",
               "target_vocabulary.txt", "spm.model", "spm.source.model", "thpc_model.json"}


def check_output_dir(checkpoint, output_dir, force):
    """Refuses an output_dir the conversion cannot take, before any work: --force replaced
    any directory whole (a training run's, with the checkpoint being converted)."""
    if not os.path.exists(output_dir):
        return
    if not os.path.isdir(output_dir):
        raise OutputDirRefused(f"{output_dir} is a file, not a directory: give the directory "
                              "to write the CTranslate2 model to")
    if not force:
        raise OutputDirRefused(f"{output_dir} exists (--force replaces it)")
    inside = os.path.commonpath([os.path.realpath(checkpoint), os.path.realpath(output_dir)])
    if inside == os.path.realpath(output_dir):
        raise OutputDirRefused(f"{output_dir} holds the checkpoint {checkpoint}: --force would "
                              "delete it; give another --output_dir")
    others = sorted(set(os.listdir(output_dir)) - MODEL_FILES)
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise OutputDirRefused(f"{output_dir} holds {shown}, which no conversion writes (a "
                              "training run's directory?): --force replaces a CTranslate2 "
                              "model's directory only; give another --output_dir")


def convert(checkpoint, output_dir, quantization=None, force=False):
    """Writes the CTranslate2 model; returns a one-line summary."""
    check_output_dir(checkpoint, output_dir, force)
    try:
        arch, eps, params, spm_model, source_spm_model = read_checkpoint(checkpoint)
        check_parameters(arch, params)
        if spm_model is None:
            raise ConversionError("holds no SentencePiece model (its run had none): the "
                                  "CTranslate2 model needs the vocabulary's pieces")
        pieces, special, special_ids = vocabulary(spm_model, arch["vocab_size"])
        source_pieces = None
        if arch["source_vocab_size"] > 0:
            if source_spm_model is None:
                raise ConversionError("holds a model of separate vocabularies but no "
                                      "source_spm_model (its run had none): the CTranslate2 "
                                      "model needs the source vocabulary's pieces")
            source_pieces, source_special, source_ids = vocabulary(
                source_spm_model, arch["source_vocab_size"], "source ")
            # One set of special ids serves both sides (src/data/batch.cc makes the source's
            # eos and pad with the target's; transformer_preprocess and transformer_decode
            # refuse models that differ).
            if source_ids != special_ids:
                def spelt(ids):
                    return "/".join(str(ids[name]) for name in ("pad", "unk", "bos", "eos"))
                raise ConversionError(
                    f"its source SentencePiece model has the special ids pad/unk/bos/eos "
                    f"{spelt(source_ids)}, the target's {spelt(special_ids)}: the file is "
                    "damaged (transformer_preprocess gives both sides the same ids)")
            # CTranslate2's config names one unk and eos token for both vocabularies (its
            # bos is the target's alone: add_source_bos is off).
            differing = [name for name in ("unk", "eos")
                         if source_special[name] != special[name]]
            if differing:
                raise ConversionError(
                    "its source and target SentencePiece models spell "
                    + ", ".join(f"{name} as '{source_special[name]}' and '{special[name]}'"
                                for name in differing)
                    + ": CTranslate2's model names one of each for both vocabularies")
    except ConversionError as error:
        raise type(error)(f"checkpoint {checkpoint}: {error}") from None
    spec, version = build_spec(arch, eps, params, pieces, special, source_pieces)
    spec.validate()
    spec.optimize(quantization=quantization)  # aliases the three uses of embed.weight
    parent = os.path.dirname(os.path.abspath(output_dir))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as error:
        raise ConversionError(f"cannot make {parent} for {output_dir}: "
                              f"{error.strerror or error}") from None
    staging = tempfile.mkdtemp(prefix=".convert_", dir=parent)
    try:
        with open(os.path.join(staging, "spm.model.source"), "wb") as file:
            file.write(spm_model)
        spec.register_file(os.path.join(staging, "spm.model.source"), "spm.model")
        if source_pieces is not None:
            with open(os.path.join(staging, "spm.source.model.source"), "wb") as file:
                file.write(source_spm_model)
            spec.register_file(os.path.join(staging, "spm.source.model.source"),
                               "spm.source.model")
        # What translate_ctranslate2.py needs beside CTranslate2's files (the position
        # table's length caps inputs and outputs as in transformer_decode), and provenance.
        with open(os.path.join(staging, "thpc_model.json.source"), "w", encoding="utf-8") as file:
            json.dump({"checkpoint": os.path.abspath(checkpoint), "step": arch["step"],
                       "architecture": arch["text"], "max_positions": arch["max_positions"],
                       "layernorm_eps": eps,
                       "source_vocab_size": arch["source_vocab_size"]},
                      file, indent=2, sort_keys=True)
            file.write("\n")
        spec.register_file(os.path.join(staging, "thpc_model.json.source"), "thpc_model.json")
        written = os.path.join(staging, "model")
        os.makedirs(written)
        spec.save(written)
        if os.path.exists(output_dir):
            shutil.rmtree(output_dir)
        os.replace(written, output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return (f"wrote {output_dir}: CTranslate2 {version} TransformerSpec, {arch['layers']} + "
            f"{arch['layers']} layers, d_model {arch['d_model']}, {arch['heads']} heads, "
            f"vocabulary {arch['vocab_size']}"
            + (f" (source {arch['source_vocab_size']})" if arch["source_vocab_size"] else "")
            + f", {arch['positions']} positions "
            f"({arch['max_positions']}), layer-norm eps {eps:g}, weights "
            f"{quantization or 'float32'}")


class Parser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"{PROGRAM}: {message} (see --help)\n")
        sys.exit(2)


def main():
    parser = Parser(prog=PROGRAM, description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True,
                        help="a transformer_hpc checkpoint (step_*.h5, an average, best.h5)")
    parser.add_argument("--output_dir", required=True, help="the CTranslate2 model directory")
    parser.add_argument("--quantization", default=None,
                        choices=["float32", "float16", "bfloat16", "int8", "int8_float32",
                                 "int8_float16", "int8_bfloat16", "int16"],
                        help="weight type stored (default float32, as trained; CTranslate2 "
                             "also converts at load time with compute_type)")
    parser.add_argument("--force", action="store_true", help="replace an existing output_dir")
    args = parser.parse_args()
    try:
        print(convert(args.checkpoint, args.output_dir, args.quantization, args.force))
    except ConversionError as error:
        sys.stderr.write(f"{PROGRAM}: error: {error}\n")
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
