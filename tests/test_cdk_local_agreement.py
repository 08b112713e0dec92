"""The local stack and the deployed stack agree: ``agentq.resources.provision`` (what the local
stack and the tests run on moto) and the synthesized template create the same queues, table
keys, indexes, TTL and fan-out definition for an environment's prefix and queue settings."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import boto3
import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from agentq.queueing.queues import WORKSPACE_POOL
from agentq.resources import TIERS, provision, table_definition
from agentq_dev.moto_server import MotoServer
from infra.synth import Synthesized, synthesize

from tests.test_cdk_stack import (  # noqa: F401 (a fixture, shared)
    CDK_GROUP,
    ENVIRONMENTS,
    _resolve_string,
    settings_of,
    synth_root,
)

pytestmark = CDK_GROUP  # with the other tests that load the jsii runtime


@pytest.fixture(scope="module", params=list(ENVIRONMENTS))
def pair(
    request: pytest.FixtureRequest,
    synth_root: Path,  # noqa: F811 (the fixture imported above)
    moto_server: MotoServer,
) -> tuple[Synthesized, dict[str, Any]]:
    """(the synthesized environment, what provision() made on moto with the same prefix)."""
    env_name = request.param
    synth = synthesize(env_name, synth_root / env_name)
    cfg = settings_of(env_name)
    sess = boto3.session.Session(region_name="us-east-1")
    url = moto_server.endpoint_url
    provision(sess, cfg.names, endpoint_url=url, queues=cfg.queue_settings())
    sqs = sess.client("sqs", endpoint_url=url)
    ddb = sess.client("dynamodb", endpoint_url=url)
    sfn = sess.client("stepfunctions", endpoint_url=url)
    queues = {}
    tiers = [cfg.names.queue(t) for t in TIERS] + [cfg.names.dlq(t) for t in TIERS]
    for name in [*tiers, cfg.names.webhooks, cfg.names.webhooks_dlq]:
        queue_url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        queues[name] = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
    machine = next(
        m for page in sfn.get_paginator("list_state_machines").paginate()
        for m in page["stateMachines"] if m["name"] == cfg.names.state_machine
    )  # fmt: skip
    local = {
        "queues": queues,
        "table": ddb.describe_table(TableName=cfg.names.table)["Table"],
        "ttl": ddb.describe_time_to_live(TableName=cfg.names.table)["TimeToLiveDescription"],
        "definition": json.loads(sfn.describe_state_machine(stateMachineArn=machine["stateMachineArn"])["definition"]),
    }
    return synth, local


def _deployed_queues(synth: Synthesized) -> dict[str, dict[str, Any]]:
    return {r["Properties"]["QueueName"]: r["Properties"] for r in synth.resources("AWS::SQS::Queue").values()}


def test_queues_agree_on_visibility_retention_and_redrive(pair: tuple[Synthesized, dict[str, Any]]) -> None:
    synth, local = pair
    cfg = settings_of(synth.env_name)
    deployed = _deployed_queues(synth)
    dlq_names = {lid: r["Properties"]["QueueName"] for lid, r in synth.resources("AWS::SQS::Queue").items()}
    # The reaper's DLQ is deployment-only: locally nothing expires, so nothing is reaped. So are the
    # EC2 workspace tier's queues (workspace.tier: ec2): the local stack runs every task on one set
    # of queues (its workers have bubblewrap); each is the default tier queue's twin.
    pooled = {cfg.names.queue(f"{WORKSPACE_POOL}-{t}") for t in TIERS} if cfg.workspace.tier == "ec2" else set()
    pooled |= {q + "-dlq" for q in pooled}
    assert set(deployed) - set(local["queues"]) == {f"{cfg.prefix}-reaper-dlq"} | pooled
    assert set(local["queues"]) <= set(deployed)
    for tier in TIERS:
        name = cfg.names.queue(tier)
        mine, theirs = deployed[name], local["queues"][name]
        if pooled:
            twin = deployed[cfg.names.queue(f"{WORKSPACE_POOL}-{tier}")]
            assert twin["VisibilityTimeout"] == mine["VisibilityTimeout"]
            assert twin["MessageRetentionPeriod"] == mine["MessageRetentionPeriod"]
            assert twin["RedrivePolicy"]["maxReceiveCount"] == mine["RedrivePolicy"]["maxReceiveCount"]
        assert int(theirs["VisibilityTimeout"]) == mine["VisibilityTimeout"]
        assert int(theirs["MessageRetentionPeriod"]) == mine["MessageRetentionPeriod"]
        local_redrive = json.loads(theirs["RedrivePolicy"])
        assert int(local_redrive["maxReceiveCount"]) == mine["RedrivePolicy"]["maxReceiveCount"]
        deployed_dlq = dlq_names[mine["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]]
        assert local_redrive["deadLetterTargetArn"].rsplit(":", 1)[-1] == deployed_dlq == cfg.names.dlq(tier)
        dlq = cfg.names.dlq(tier)
        assert int(local["queues"][dlq]["MessageRetentionPeriod"]) == deployed[dlq]["MessageRetentionPeriod"]
    hooks, theirs = deployed[cfg.names.webhooks], local["queues"][cfg.names.webhooks]
    assert int(theirs["VisibilityTimeout"]) == hooks["VisibilityTimeout"]
    assert int(json.loads(theirs["RedrivePolicy"])["maxReceiveCount"]) == hooks["RedrivePolicy"]["maxReceiveCount"]
    dlq = cfg.names.webhooks_dlq
    assert int(local["queues"][dlq]["MessageRetentionPeriod"]) == deployed[dlq]["MessageRetentionPeriod"]


def test_table_agrees_on_keys_attributes_indexes_and_ttl(pair: tuple[Synthesized, dict[str, Any]]) -> None:
    synth, local = pair
    (table,) = [r["Properties"] for r in synth.resources("AWS::DynamoDB::Table").values()]
    mine, theirs = table, local["table"]
    assert theirs["KeySchema"] == mine["KeySchema"]
    assert sorted(theirs["AttributeDefinitions"], key=str) == sorted(mine["AttributeDefinitions"], key=str)

    def indexes(gsis: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            g["IndexName"]: (
                g["KeySchema"],
                g["Projection"]["ProjectionType"],
                sorted(g["Projection"].get("NonKeyAttributes", [])),
            )
            for g in gsis
        }

    assert indexes(theirs.get("GlobalSecondaryIndexes", [])) == indexes(mine.get("GlobalSecondaryIndexes", []))
    assert theirs.get("BillingModeSummary", {}).get("BillingMode") == mine["BillingMode"] == "PAY_PER_REQUEST"
    assert local["ttl"]["TimeToLiveStatus"] == "ENABLED"
    assert local["ttl"]["AttributeName"] == mine["TimeToLiveSpecification"]["AttributeName"]
    # The stream exists to hear TTL deletions; moto runs no TTL, so the local table goes without
    # (resources.table_definition says why). What a streamed table gets is the deployed view type.
    assert "StreamSpecification" not in theirs
    streamed = table_definition(mine["TableName"], stream=True)["StreamSpecification"]
    assert mine["StreamSpecification"] == {"StreamViewType": streamed["StreamViewType"]}


def test_state_machine_definitions_are_equal(pair: tuple[Synthesized, dict[str, Any]]) -> None:
    synth, local = pair
    (machine,) = [r["Properties"] for r in synth.resources("AWS::StepFunctions::StateMachine").values()]
    assert json.loads(_resolve_string(machine["DefinitionString"])) == local["definition"]
