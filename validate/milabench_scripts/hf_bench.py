"""milabench's ``huggingface`` benchmark (bert, t5, reformer, whisper) as a plain script, for ``allocsim capture``.

    python validate/milabench_scripts/hf_bench.py --model Bert --batch-size 32 --precision fp16 --steps 2

What it keeps from milabench's ``benchmarks/huggingface/bench`` (``__main__.py``, ``models.py``,
``synth.py``; mila-iqia/milabench @21b96e79, transformers 4.49), rewritten here, not copied:

* the model is ``AutoModelFor<Category>.from_config(config)`` with random weights, moved to ``cuda``:
  Bert (``BertConfig()``, masked LM, 512 tokens), T5 (``t5-small``'s configuration, which is
  ``T5Config()``'s defaults, seq2seq LM, 1024 tokens), Reformer (``ReformerConfig()`` with 128 hash
  buckets, masked LM, 4096 tokens), Whisper (``openai/whisper-tiny``'s configuration, which is
  ``WhisperConfig()``'s defaults, audio classification, 30 s of 80 log-mel features); the
  configurations come from the library, so nothing is downloaded;
* Adam (lr 0.001) over all parameters, never ``zero_grad`` (milabench's loop does not call it);
* ``--precision``: ``tf32`` in it allows TF32; ``fp16`` in it runs the forward under
  ``torch.cuda.amp.autocast(float16)`` and enables ``GradScaler``; otherwise no autocast;
* each step: the batch (``input_ids`` and ``labels``, or ``input_features`` and ``labels``) copied
  to the GPU, forward, ``scaler.scale(outputs.loss).backward()``, ``scaler.step``, ``scaler.update``.

One value-dependent branch is answered as the GPU run answers it: the benchmark passes no attention
mask, so Bert makes an all-ones mask and transformers' ``_prepare_4d_attention_mask_for_sdpa``
checks ``torch.all(mask == 1)`` and drops it (SDPA then runs without a mask). Under ``allocsim
capture`` every value reads as zero, so that check would say "not all ones" and build a
(batch, 1, 512, 512) float mask the GPU run never has; the script tells Bert's module the answer
the real values give (no mask).
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import transformers


def build(name: str):
    """(model, batch of host tensors) as milabench builds them."""
    if name == "Bert":
        config, category, length = transformers.BertConfig(), "AutoModelForMaskedLM", 512
    elif name == "T5":
        # t5-small's config.json also sets decoder_start_token_id 0 (T5Config() leaves it unset)
        config, category, length = transformers.T5Config(decoder_start_token_id=0), "AutoModelForSeq2SeqLM", 1024
    elif name == "Reformer":
        config = transformers.ReformerConfig()
        if not config.num_buckets:
            config.num_buckets = 128
        category, length = "AutoModelForMaskedLM", 4096
    elif name == "Whisper":
        config, category, length = transformers.WhisperConfig(), "AutoModelForAudioClassification", None
    else:
        raise SystemExit(f"unknown model {name!r}")
    model = getattr(transformers, category).from_config(config)
    return model, config, length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, choices=("Bert", "T5", "Reformer", "Whisper"))
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--precision", default="fp32", choices=("fp16", "fp32", "tf32", "tf32-fp16", "bf16"))
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()

    tf32 = "tf32" in args.precision
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(1234)
    transformers.set_seed(1234)
    if args.model == "Bert":
        import transformers.models.bert.modeling_bert as bert   # noqa: PLC0415
        bert._prepare_4d_attention_mask_for_sdpa = lambda mask, dtype, tgt_len=None: None

    device = torch.device("cuda")
    model, config, length = build(args.model)
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    b = args.batch_size
    if args.model == "Whisper":
        batch = {"input_features": torch.randn(b, config.num_mel_bins, 3000),
                 "labels": torch.randint(0, config.num_labels, (b,))}
    else:
        batch = {"input_ids": torch.randint(0, config.vocab_size, (b, length)),
                 "labels": torch.randint(0, config.vocab_size, (b, length))}

    half = "fp16" in args.precision or "bf16" in args.precision
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16
    scaler = torch.cuda.amp.GradScaler(enabled=half)
    for _ in range(args.steps):
        data = {k: v.to(device) for k, v in batch.items()}
        with torch.cuda.amp.autocast(dtype=dtype) if half else contextlib.nullcontext():
            outputs = model(**data)
        loss = outputs.loss
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()


if __name__ == "__main__":
    main()
