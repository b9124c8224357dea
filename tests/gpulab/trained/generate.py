"""The frozen target at work: batched greedy continuations and the features DFlash reads.

Greedy continuations are what a DFLASH server verifies against (temperature 0), so they are both
the drafter's training data and the reference of the acceptance prediction. The loop is a plain
prefill then one token per step through transformers' KV cache: every prompt in a batch has the
same length, so there is no padding and no attention mask to get wrong.
"""

from __future__ import annotations

import time

import torch

from gpulab.trained.loop import autocast


@torch.inference_mode()
def greedy_continue(
    model: torch.nn.Module,
    prompts: torch.Tensor,
    new_tokens: int,
    batch: int,
    device: torch.device,
    cap_s: float | None = None,
) -> torch.Tensor:
    """prompts [N, P] followed by the target's greedy tokens: [n, P + new_tokens], n <= N.

    EOS does not stop a row (training data wants full rows; the acceptance walk cuts at EOS).
    When cap_s passes, the batches done so far are returned (at least one batch always runs).
    """
    model.eval()
    started = time.monotonic()
    rows = []
    for start in range(0, len(prompts), batch):
        if rows and cap_s is not None and time.monotonic() - started > cap_s:
            break
        ids = prompts[start : start + batch].to(device)
        with autocast(device):
            out = model(input_ids=ids, use_cache=True)
            cache = out.past_key_values
            tokens = [out.logits[:, -1].argmax(-1)]
            for _ in range(new_tokens - 1):
                out = model(input_ids=tokens[-1][:, None], past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                tokens.append(out.logits[:, -1].argmax(-1))
        rows.append(torch.cat([ids, torch.stack(tokens, dim=1)], dim=1).cpu())
    return torch.cat(rows)


def target_features(
    model: torch.nn.Module, tokens: torch.Tensor, layer_ids: tuple[int, ...]
) -> torch.Tensor:
    """[N, S, K*H]: the residual stream after each layer in layer_ids, ascending, concatenated.

    transformers' hidden_states[k + 1] is the output of layer k (index 0 is the embedding), the
    same tensor SGLang's Qwen3 captures for target layer k (research doc, section 1.3).
    """
    hidden = model.model(input_ids=tokens, output_hidden_states=True).hidden_states
    return torch.cat([hidden[k + 1] for k in sorted(layer_ids)], dim=-1)


@torch.inference_mode()
def greedy_answers(
    model: torch.nn.Module,
    prompts: list[list[int]],
    new_tokens: int,
    eos_id: int,
    device: torch.device,
) -> list[list[int]]:
    """Each prompt's greedy answer, cut after its first EOS (where a server stops).

    Prompts of different lengths go in one left-padded `generate` call: a few seconds for the
    held-out set instead of one sequential decode per prompt.
    """
    model.eval()
    width = max(len(ids) for ids in prompts)
    padded = torch.full((len(prompts), width), eos_id, dtype=torch.long)
    attention = torch.zeros_like(padded)
    for row, ids in enumerate(prompts):
        padded[row, width - len(ids) :] = torch.tensor(ids)
        attention[row, width - len(ids) :] = 1
    with autocast(device):
        out = model.generate(
            input_ids=padded.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=eos_id,
            eos_token_id=eos_id,
        )
    answers = []
    for row in out[:, width:].cpu().tolist():
        answers.append(row[: row.index(eos_id) + 1] if eos_id in row else row)
    return answers
