"""transformers serving the same requests: (b) one at a time, (c) static batches, (d) its own
continuous batching (generate_batch). All greedy, end of sequence switched off, so every
system produces exactly the requested number of tokens."""

from __future__ import annotations

import time

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

# eos_token_id=-1 never matches a token: generation runs to max_new_tokens, like ignore_eos.
_NO_EOS = {"eos_token_id": -1, "pad_token_id": 0, "do_sample": False}


class HFBaselines:
    def __init__(self, folder: str, dtype: torch.dtype = torch.float32) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()

    @torch.inference_mode()
    def one(self, prompt: list[int], max_new: int) -> float:
        """Seconds to generate max_new tokens for one prompt."""
        ids = torch.tensor([prompt])
        start = time.perf_counter()
        self.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
            min_new_tokens=max_new, **_NO_EOS,
        )  # fmt: skip
        return time.perf_counter() - start

    def decode_rate(self, prompt: list[int], max_new: int) -> dict[str, float]:
        """Single stream: tokens/s after the first token, and the time to the first token."""
        t1 = self.one(prompt, 1)
        tn = self.one(prompt, max_new)
        return {"ttft": t1, "decode_tok_s": (max_new - 1) / max(tn - t1, 1e-9)}

    def sequential(self, prompts: list[list[int]], max_new: int, sample: int) -> dict[str, float]:
        """(b): one request at a time. Timed on `sample` requests, extrapolated to all."""
        timed = prompts[:sample]
        seconds = sum(self.one(p, max_new) for p in timed) / len(timed) * len(prompts)
        return {"seconds": seconds, "tok_s": len(prompts) * max_new / seconds, "sampled": sample}

    @torch.inference_mode()
    def static_batch(self, prompts: list[list[int]], max_new: int) -> dict[str, float]:
        """(c): all arrived requests in one left-padded generate()."""
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        start = time.perf_counter()
        self.model.generate(
            ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=max_new, **_NO_EOS
        )
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "tok_s": len(prompts) * max_new / seconds}

    @torch.inference_mode()
    def continuous(self, prompts: list[list[int]], max_new: int) -> dict[str, float]:
        """(d): transformers' own continuous batching manager."""
        config = GenerationConfig(max_new_tokens=max_new, **_NO_EOS)
        start = time.perf_counter()
        out = self.model.generate_batch(inputs=prompts, generation_config=config, warmup=False)
        seconds = time.perf_counter() - start
        produced = sum(len(o.generated_tokens) for o in out.values())
        return {"seconds": seconds, "tok_s": produced / seconds}
