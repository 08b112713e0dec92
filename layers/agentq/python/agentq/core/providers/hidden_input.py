"""The input a provider bills for a request that its JSON does not show, and so that an estimate
from the request's size alone would miss (``engine.conversation.estimate_input_tokens``, the
estimate every budget hold is sized on: ARCHITECTURE 4).

What the providers agentq calls document:

- Anthropic (the Messages API, Claude on Bedrock through InvokeModel, and Claude on Bedrock
  Converse, which bills the same request): "When you use tools, we also automatically include
  a special system prompt for the model which enables tool use", billed as input tokens, per
  model and ``tool_choice`` (docs, "Tool use pricing and tokens",
  https://docs.anthropic.com/en/docs/tool-use-pricing-and-tokens): Claude 3 Opus 530 (auto) /
  281 (any, tool); Claude 3 Sonnet 159 / 235; Claude 3 Haiku and 3.5 Haiku 264 / 340; the
  legacy tools beta on Claude 3 Opus 395; Claude 3.5 Sonnet, 3.7 and the Claude 4 family
  346 / 313. agentq sends no ``tool_choice`` (auto), but the bound takes both columns.
- OpenAI Chat Completions (the cookbook's "How to count tokens with tiktoken"): 3 tokens a
  message, 3 that prime the reply, and for the tools 7 (10 on gpt-3.5 and gpt-4) a function,
  3 a property and 12 closing the list. Each message's and function's own figure is smaller
  than the characters of its JSON at three a token, which the estimate counts already; the
  fixed 15 are under the estimate's base of 16 and this bound alike.
- Bedrock Converse with other models (Nova, Llama, Mistral, ...): their chat templates wrap a
  tool list in instructions whose size AWS does not publish; those their model cards show
  (Llama 3.1's JSON tool-calling instructions) are a few dozen tokens.

So one constant, ``TOOL_PROMPT_TOKENS``, is added for any request that offers tools, whichever
provider and model answers it (a fallback may be another): 600, above the largest published
figure (530) with room for a revision of it. A request without tools adds nothing: no
provider documents a hidden addition to one.
"""

from __future__ import annotations

from agentq.core.providers.base import LLMRequest

TOOL_PROMPT_TOKENS = 600


def hidden_input_tokens(request: LLMRequest) -> int:
    """The most input tokens a provider may bill for ``request`` beyond its JSON (see the module)."""
    return TOOL_PROMPT_TOKENS if request.tools else 0
