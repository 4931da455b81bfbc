"""Chat-template families as test fixtures: the SmolLM2 tokenizer with each family's special tokens added
and a template of our own that renders the way that family does (DESIGN.md §6).

Nothing can be downloaded from a model hub here, so each family is written down: its special tokens, its
end-of-turn token and a Jinja template. The templates follow the families' published conventions
(ChatML of SmolLM2/Qwen2.5; the think gate of reasoning models; Llama-3.x header ids, `<|eot_id|>` and the
`ipython` tool role with JSON calls; Mistral `[INST]`, `[TOOL_CALLS]`, `[TOOL_RESULTS]`), written for
these tests. `family_model_dir` adds a tiny random Llama sized to the extended vocabulary, so the real
HF backend runs on every family.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ChatML with tools rendered in the system message and tool results as <tool_response> in a user turn
# (the Qwen2.5 layout).
CHATML = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call functions. Their signatures:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nCall one like this:\\n<tool_call>\\n{\"name\": <name>, \"arguments\": <args>}\\n"
    "</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# ChatML with a think gate: only the LAST message, when it is the assistant's, keeps its reasoning (an
# empty <think></think> block when it has none); earlier assistant turns are rendered without it.
# enable_thinking=false closes the think block in the generation prompt.
THINK_GATE = CHATML.replace(
    "{%- else %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}",
    "{%- elif m.role == 'assistant' %}"
    "{%- set content = m.content %}{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.last %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}",
).replace(
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}",
)

# Llama 3.x: header ids, <|eot_id|>, tools and the JSON call convention in the first user message,
# tool results in the ipython role.
LLAMA3 = (
    "{{- bos_token }}"
    "{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}{%- set rest = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set rest = messages %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools %}{{- 'Environment: ipython\\n' }}{%- endif %}"
    "{{- system + '<|eot_id|>' }}"
    "{%- for m in rest %}"
    "{%- if m.role == 'tool' or m.role == 'ipython' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}"
    "{%- elif m.role == 'user' and loop.first and tools %}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}"
    "{{- 'To call a function, answer with only a JSON object '"
    "    '{\"name\": function name, \"parameters\": {argument: value}}. Functions:\\n' }}"
    "{%- for tool in tools %}{{- (tool | tojson) + '\\n' }}{%- endfor %}"
    "{{- '\\n' + m.content + '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# Mistral: [INST] turns with the system text and the tool list before the last user message,
# assistant turns closed by </s>, tool results as [TOOL_RESULTS] JSON. No generation header.
MISTRAL = (
    "{{- bos_token }}"
    "{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}{%- set rest = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set rest = messages %}{%- endif %}"
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in rest %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in rest %}"
    "{%- if m.role == 'user' %}"
    "{%- if loop.index0 == ns.last_user and tools %}"
    "{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{%- if loop.index0 == ns.last_user and system %}"
    "{{- '[INST]' + system + '\\n\\n' + m.content + '[/INST]' }}"
    "{%- else %}{{- '[INST]' + m.content + '[/INST]' }}{%- endif %}"
    "{%- elif m.role == 'assistant' and m.tool_calls is defined and m.tool_calls %}"
    "{{- (m.content or '') + '[TOOL_CALLS]' + (m.tool_calls | map(attribute='function') | list | tojson)"
    "    + eos_token }}"
    "{%- elif m.role == 'assistant' %}"
    "{{- m.content + eos_token }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '[TOOL_RESULTS]' + ({'content': m.content, 'call_id': m.tool_call_id | default('')} | tojson)"
    "    + '[/TOOL_RESULTS]' }}"
    "{%- else %}{{- raise_exception('unexpected role ' + m.role) }}"
    "{%- endif %}"
    "{%- endfor %}"
)


@dataclass(frozen=True)
class Family:
    name: str
    template: str
    special_tokens: tuple[str, ...]
    eos: str
    bos: str | None
    parser: str  # the tool-call parser picked for this template
    kwargs: tuple[tuple[str, Any], ...] = ()  # chat-template kwargs of this variant

    def call_text(self, name: str, arguments: dict[str, Any]) -> str:
        """A tool call written the way this family's models write one."""
        if self.parser == "llama3-json":
            return json.dumps({"name": name, "parameters": arguments})
        if self.parser == "mistral":
            return "[TOOL_CALLS]" + json.dumps([{"name": name, "arguments": arguments, "id": "a1b2c3d4e"}])
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


_CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
FAMILIES: dict[str, Family] = {
    "chatml": Family("chatml", CHATML, _CHATML_TOKENS, "<|im_end|>", None, "hermes"),
    "think": Family("think", THINK_GATE, (*_CHATML_TOKENS, "<think>", "</think>"), "<|im_end|>", None, "hermes"),
    "think-off": Family("think-off", THINK_GATE, (*_CHATML_TOKENS, "<think>", "</think>"), "<|im_end|>", None,
                        "hermes", (("enable_thinking", False),)),
    "llama3": Family("llama3", LLAMA3, ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                        "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"),
                     "<|eot_id|>", "<|begin_of_text|>", "llama3-json"),
    "mistral": Family("mistral", MISTRAL, ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                                           "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
                      "</s>", "<s>", "mistral"),
}


def family_tokenizer(family: Family) -> Any:
    """The SmolLM2 tokenizer with the family's special tokens, end-of-turn token and template."""
    from arlctl.models import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(family.special_tokens)})
    tokenizer.eos_token = family.eos
    if family.bos is not None:
        tokenizer.bos_token = family.bos
    tokenizer.chat_template = family.template
    return tokenizer


def family_model_dir(root: Path, family: Family, seed: int = 0) -> Path:
    """A tiny random Llama over the family's tokenizer, saved as an HF model directory under root."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = root / f"tiny-{family.name}"
    if (directory / "config.json").is_file():
        return directory
    tokenizer = family_tokenizer(family)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         initializer_range=0.2, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
