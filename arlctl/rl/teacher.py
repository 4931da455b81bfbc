"""A distillation teacher behind an engine URL: the log-probs of given token ids from an OpenAI-compatible server.

`train --teacher http://HOST:PORT` scores each trained row's tokens with the server's completions endpoint:
the row's ids as the prompt, `max_tokens: 1`, `prompt_logprobs: 0` (vLLM's extension; it returns, for every
prompt position after the first, the log-prob of the token that is there). The engine scores at its own
temperature 1, so use it with rollouts sampled at temperature 1. Every failure is a TerminalError or a
TransientError naming the server; a reply that does not hold one finite log-prob per token is refused, never
read as zeros.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from typing import Any

import torch

from arlctl.errors import TerminalError, TransientError

TIMEOUT_S = 120.0


class EngineTeacher:
    """Scores micro-batches through a vLLM-compatible `/v1/completions` endpoint (see the module docstring)."""

    def __init__(self, url: str, model: str | None = None, timeout_s: float = TIMEOUT_S) -> None:
        self.base = url.rstrip("/").removesuffix("/v1")
        self.timeout_s = timeout_s
        self.model = model or self._served_model()

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 (the user's URL)
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            detail = err.read()[:300].decode(errors="replace")
            raise TerminalError(f"teacher {self.base} refused {path}: HTTP {err.code} {detail}",
                                hint="the teacher must return prompt log-probs (vllm serve)") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            raise TransientError(f"teacher {self.base} unreachable: {err}") from None
        except ValueError as err:
            raise TerminalError(f"teacher {self.base} answered {path} with no JSON: {err}") from None

    def _served_model(self) -> str:
        reply = self._post("/v1/models")
        data = reply.get("data") if isinstance(reply, dict) else None
        if not data or not isinstance(data[0], dict) or not isinstance(data[0].get("id"), str):
            raise TerminalError(f"teacher {self.base}/v1/models lists no model")
        return data[0]["id"]

    def token_logprobs(self, ids: list[int]) -> list[float]:
        """log p(ids[t] | ids[:t]) for t = 1 .. len(ids) - 1."""
        reply = self._post("/v1/completions", {"model": self.model, "prompt": ids, "max_tokens": 1,
                                               "temperature": 1.0, "prompt_logprobs": 0})
        try:
            scored = reply["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise TerminalError(f"teacher {self.base} returned no prompt_logprobs",
                                hint="the teacher must be a vLLM-compatible server") from None
        if not isinstance(scored, list) or len(scored) != len(ids):
            raise TerminalError(f"teacher {self.base} scored {len(scored) if isinstance(scored, list) else 0} of "
                                f"{len(ids)} prompt tokens")
        out = []
        for t in range(1, len(ids)):
            entry = scored[t] if isinstance(scored[t], dict) else {}
            value = entry.get(str(ids[t]), entry.get(ids[t]))
            logprob = value.get("logprob") if isinstance(value, dict) else value
            if not isinstance(logprob, int | float) or isinstance(logprob, bool) or not math.isfinite(logprob):
                raise TerminalError(f"teacher {self.base} gave no finite log-prob for token {ids[t]} at {t}")
            out.append(float(logprob))
        return out

    def score_micro_batch(self, mb: Any) -> torch.Tensor:
        """[B, L-1] log-probs laid out like mb.loss_mask (position t: token t + 1), 0 where not trained."""
        out = torch.zeros(mb.loss_mask.shape, dtype=torch.float32)
        lengths = mb.attention_mask.sum(dim=-1).tolist()
        for b, n in enumerate(lengths):
            if not bool(mb.loss_mask[b].any()):
                continue
            ids = mb.input_ids[b, :n].tolist()
            out[b, : n - 1] = torch.tensor(self.token_logprobs(ids), dtype=torch.float32)
        return torch.where(mb.loss_mask.cpu(), out, torch.zeros_like(out))
