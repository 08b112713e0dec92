"""Which models the task runners may call: Bedrock models by IAM, OpenAI-compatible servers by
URL and key (``bedrock_models``, ``openai_base_url``, ``openai_api_key_secret`` in cdk.json).

Converse is authorised as ``bedrock:InvokeModel`` and ConverseStream as
``bedrock:InvokeModelWithResponseStream`` (Bedrock has no IAM action of their own), the same two
actions AnthropicBedrock uses, so one statement covers both providers; its resources are the
configured models only. An ARN is granted as given; a model id in this region; an inference
profile id (``us.amazon.nova-pro-v1:0``) as the profile in this account and region plus its
model in every region, since a cross-region profile runs the model wherever it routes the call.

The resources are templates (``{partition}``, ``{region}``, ``{account}``) so the stack (CDK
tokens) and its cdk-nag acknowledgements (nag's ``<AWS::Region>`` spelling) come from one list.
"""

from __future__ import annotations

from agentq.core.model_ids import PROFILE_PREFIXES

# Converse and InvokeModel; ConverseStream and InvokeModelWithResponseStream.
BEDROCK_ACTIONS = ["bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream"]
_BEDROCK = "arn:{partition}:bedrock"


def bedrock_resource_templates(models: list[str]) -> list[str]:
    """The ARN templates a ``bedrock_models`` list grants, without duplicates, in order."""
    out: list[str] = []
    for model in models:
        if model.startswith("arn:"):
            arns = [model]
        elif "." in model and (profile := model.split(".", 1))[0] in PROFILE_PREFIXES | {"*"}:
            arns = [
                f"{_BEDROCK}:{{region}}:{{account}}:inference-profile/{model}",
                f"{_BEDROCK}:*::foundation-model/{profile[1]}",
            ]
        else:
            arns = [f"{_BEDROCK}:{{region}}::foundation-model/{model}"]
        out += [a for a in arns if a not in out]
    return out


def bedrock_resources(models: list[str], *, partition: str, region: str, account: str) -> list[str]:
    return [t.format(partition=partition, region=region, account=account) for t in bedrock_resource_templates(models)]


def wildcard_reason(template: str) -> str:
    """Why a granted Bedrock resource holds a '*' (cdk-nag's IAM5 acknowledgement)."""
    if ":*::foundation-model/" in template:
        return (
            "A cross-region inference profile in bedrock_models runs its model in whichever region it routes the "
            "call to; the grant is InvokeModel(WithResponseStream) on that model (or family) only."
        )
    return (
        "bedrock_models in cdk.json names this family of models on purpose (a task picks its model at submit "
        "time); the grant is InvokeModel(WithResponseStream) on that family only."
    )
