#!/usr/bin/env python3
"""Translates with Hugging Face transformers' generate() over our checkpoint's weights,
loaded into a MarianMTModel that computes exactly our model, for
bench/decode_vs_ctranslate2.sh.

  bench/hf_marian_translate.py --checkpoint FILE.h5 [the options of
      tools/translate_ctranslate2.py: --input --output --beam --greedy --lenpen
      --max-len-a --max-len-b --nbest --batch-tokens|--batch-sentences --threads
      --device --stats]

Why Marian represents our model exactly: it is post-norm (LayerNorm(x + sublayer(x)),
no final stack norm, no embedding norm), scales embeddings by sqrt(d_model)
(scale_embedding), has separate Q, K, V projections (our fused ones split by columns)
with biases (zero where we have none), an FFN with the activation we set (ReLU), one
embedding matrix shared by encoder, decoder and the output projection (its
final_logits_bias zero), and a position table it only looks up: the sinusoid it makes
(sin in the first half of each row, cos in the second) is overwritten with ours
(interleaved) or with embed.positions. Every LayerNorm gets our layernorm_eps. It cannot
hold d_k * h != d_model (its head width is d_model / h): refused.

The search: generate() with num_beams, length_penalty (its score is log P / n^A, n the
generated tokens with eos: only A = 0 ranks as ours does), early_stopping False (stop
when no live beam can beat the worst of `beam` finished ones: ours), max_new_tokens the
sentence's limit (a*|x| + b, capped at max_positions - 1, as ours), min_new_tokens 0, the
decoder started from bos (2) and ended by eos (3), nothing forced or suppressed (as for
CTranslate2: tools/translate_ctranslate2.py says why). Batches as transformer_decode
makes them (sentences by length, longest * count <= --batch-tokens), or --batch-sentences.
Needs torch, transformers, sentencepiece, h5py and numpy; fp32 on the CPU
(torch.set_num_threads(--threads)).
"""
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))

import convert_to_ctranslate2 as checkpoints  # noqa: E402  (tools/)
import translate_ctranslate2 as driver  # noqa: E402

PROGRAM = "hf_marian_translate.py"


def marian_model(path, torch, transformers):
    """A MarianMTModel holding the checkpoint's weights; its max_positions and eps."""
    arch, eps, params, spm_model, _ = checkpoints.read_checkpoint(path)
    checkpoints.check_parameters(arch, params)
    if arch["source_vocab_size"] > 0:
        # MarianConfig could take them (share_encoder_decoder_embeddings off), but this
        # peer's driver encodes the input with one SentencePiece model.
        raise checkpoints.ConversionError(
            "a model of separate source and target vocabularies: this peer maps one "
            "vocabulary only")
    d, h, layers = arch["d_model"], arch["heads"], arch["layers"]
    if arch["d_k"] * h != d:
        raise checkpoints.ConversionError(
            f"d_k = {arch['d_k']} with {h} heads is not d_model = {d}: Marian's head width "
            "is d_model / heads")
    config = transformers.MarianConfig(
        vocab_size=arch["vocab_size"], decoder_vocab_size=arch["vocab_size"], d_model=d,
        encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=h,
        decoder_attention_heads=h, encoder_ffn_dim=arch["d_ff"], decoder_ffn_dim=arch["d_ff"],
        activation_function="relu", max_position_embeddings=arch["max_positions"],
        scale_embedding=True, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=0, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2,
        forced_eos_token_id=None, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True)
    model = transformers.MarianMTModel(config).eval()
    positions = (params["embed.positions"] if arch["positions"] == "learned"
                 else checkpoints.sinusoid_table(arch["max_positions"], d))

    def tensor(array):
        return torch.from_numpy(array.copy())

    def linear(module, name, rows=slice(None)):
        """Our y = x W (+ b), W [in, out], columns `rows` of it, as torch's [out, in]."""
        module.weight.copy_(tensor(params[name + ".weight"][:, rows].T))
        bias = params.get(name + ".bias")
        module.bias.copy_(tensor(bias.reshape(-1)[rows]) if bias is not None
                          else torch.zeros_like(module.bias))

    def norm(module, name):
        module.weight.copy_(tensor(params[name + ".gamma"].reshape(-1)))
        module.bias.copy_(tensor(params[name + ".beta"].reshape(-1)))
        module.eps = eps

    q, k, v = slice(0, d), slice(d, 2 * d), slice(2 * d, 3 * d)

    def self_attention_and_ffn(layer, p, ffn_norm):
        for projection, columns in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
            linear(getattr(layer.self_attn, projection), p + "self_attn.qkv", columns)
        linear(layer.self_attn.out_proj, p + "self_attn.out")
        norm(layer.self_attn_layer_norm, p + "norm1")
        linear(layer.fc1, p + "ffn.fc1")
        linear(layer.fc2, p + "ffn.fc2")
        norm(layer.final_layer_norm, p + ffn_norm)

    with torch.no_grad():
        inner = model.model
        for embedding in (inner.shared, inner.encoder.embed_tokens, inner.decoder.embed_tokens,
                          model.lm_head):
            embedding.weight.copy_(tensor(params["embed.weight"]))
        model.final_logits_bias.zero_()
        for stack in (inner.encoder, inner.decoder):
            stack.embed_positions.weight.copy_(tensor(positions))
        for i in range(layers):
            self_attention_and_ffn(inner.encoder.layers[i], f"encoder.{i}.", "norm2")
            layer, p = inner.decoder.layers[i], f"decoder.{i}."
            self_attention_and_ffn(layer, p, "norm3")
            linear(layer.encoder_attn.q_proj, p + "cross_attn.q")
            linear(layer.encoder_attn.k_proj, p + "cross_attn.kv", slice(0, d))
            linear(layer.encoder_attn.v_proj, p + "cross_attn.kv", slice(d, 2 * d))
            linear(layer.encoder_attn.out_proj, p + "cross_attn.out")
            norm(layer.encoder_attn_layer_norm, p + "norm2")
    return model, arch["max_positions"], spm_model


def batches_of(lengths, budget, sentences):
    """transformer_decode's batches (src/decode/translate.cc make_decode_batches): longest
    first, a batch closed when longest * (count + 1) would pass the token budget; or
    `sentences` at a time."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, batch, longest = [], [], 0
    for i in order:
        longer = max(longest, lengths[i])
        full = (len(batch) >= sentences if sentences
                else batch and longer * (len(batch) + 1) > budget)
        if full:
            batches.append(batch)
            batch, longer = [], lengths[i]
        batch.append(i)
        longest = longer
    if batch:
        batches.append(batch)
    return batches


def main():
    args = driver.parse_arguments(PROGRAM, __doc__, "--checkpoint",
                                  "a transformer_hpc checkpoint")
    try:
        import sentencepiece
        import torch
        import transformers
    except ImportError as missing:
        driver.fail(f"needs torch, transformers and sentencepiece ({missing})", PROGRAM)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    spm = sentencepiece.SentencePieceProcessor()
    try:
        with checkpoints.h5py.File(args.checkpoint, "r") as file:
            spm.LoadFromSerializedProto(file["spm_model"][()].tobytes())
            max_positions = checkpoints.parse_architecture(
                str(file.attrs["architecture"].decode() if isinstance(
                    file.attrs["architecture"], bytes) else file.attrs["architecture"])
            )["max_positions"]
    except (OSError, KeyError, RuntimeError, checkpoints.ConversionError) as error:
        driver.fail(f"checkpoint {args.checkpoint}: no SentencePiece model or architecture "
                    f"to read ({error})", PROGRAM)

    def load():
        """Reading the checkpoint, building the Marian model and placing it: the part of
        the run that CTranslate2's Translator() and our program's start also do."""
        try:
            model = marian_model(args.checkpoint, torch, transformers)[0]
        except checkpoints.ConversionError as error:
            driver.fail(f"checkpoint {args.checkpoint}: {error}", PROGRAM)
        model = model.to(device)
        # One warm-up generation (a one-piece sentence), counted as loading, as
        # tools/translate_ctranslate2.py does: the first call's one-time set-up is not
        # decoding, and ours, timed less an empty run, holds none.
        with torch.inference_mode():
            model.generate(input_ids=torch.tensor([[spm.piece_to_id("a"), 3]], device=device),
                           num_beams=args.beam, max_new_tokens=2, decoder_start_token_id=2,
                           eos_token_id=3, pad_token_id=0)
        return model

    def translate_group(marian, sources, limit):
        ids = [[spm.piece_to_id(piece) for piece in pieces] + [3] for pieces in sources]
        found = [None] * len(ids)
        for batch in batches_of([len(x) for x in ids], args.batch_tokens,
                                args.batch_sentences):
            width = max(len(ids[i]) for i in batch)
            input_ids = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):
                input_ids[row, :len(ids[i])] = torch.tensor(ids[i])
                mask[row, :len(ids[i])] = 1
            with torch.inference_mode():
                out = marian.generate(
                    input_ids=input_ids.to(device), attention_mask=mask.to(device),
                    num_beams=args.beam, num_return_sequences=args.nbest,
                    length_penalty=args.lenpen, early_stopping=False, do_sample=False,
                    max_new_tokens=limit, min_new_tokens=0, decoder_start_token_id=2,
                    eos_token_id=3, pad_token_id=0, forced_eos_token_id=None,
                    output_scores=args.nbest > 1, return_dict_in_generate=True)
            sequences = out.sequences.tolist()
            scores = (out.sequences_scores.tolist() if args.nbest > 1 and
                      out.sequences_scores is not None else [math.nan] * len(sequences))
            for row, i in enumerate(batch):
                hypotheses, values = [], []
                for n in range(args.nbest):
                    tokens = sequences[row * args.nbest + n][1:]  # after the start token
                    if 3 in tokens:
                        tokens = tokens[:tokens.index(3)]
                    hypotheses.append(tokens)
                    values.append(scores[row * args.nbest + n])
                found[i] = (hypotheses, values)
        return found

    driver.translate(args, PROGRAM, "hf_stats", max_positions, spm, load, translate_group)
    return 0


if __name__ == "__main__":
    sys.exit(main())
