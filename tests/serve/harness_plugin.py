"""A second harness, written against the protocol only (arlctl/harnesses/base.py), for --harness module:factory.

It asks the gateway once (urllib, the session header set) and writes the reply's length into NOTE.txt in
the sandbox: the rollout takes that as the run's diff. No arlctl loop code knows it exists."""

from __future__ import annotations

import asyncio
import json
import urllib.request

from arlctl.harnesses import HarnessContext, HarnessResult


class OneShot:
    name = "one-shot"

    def __init__(self, note: str = "NOTE.txt"):
        self.note = note

    async def run(self, ctx: HarnessContext) -> HarnessResult:
        body = {"model": ctx.model, "max_tokens": 16, "temperature": ctx.temperature,
                "messages": [{"role": "user", "content": ctx.problem}]}
        request = urllib.request.Request(f"{ctx.base_url}/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", "X-Arlctl-Session": ctx.session_id})

        def ask() -> dict:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.load(response)

        reply = await asyncio.to_thread(ask)
        text = reply["choices"][0]["message"]["content"] or ""
        await ctx.sandbox.exec(["bash", "-c", f"echo {len(text)} > {self.note}"], timeout=10)
        return HarnessResult("submitted", "wrote the note", steps=1)


def make(**options) -> OneShot:
    return OneShot(**options)
