"""The one table of AWS list prices every bench and every dollar figure in the docs is priced with.

Why one table: the benches each carried their own constants and kept DynamoDB's on-demand
prices of before November 2024 ($1.25 / $0.25 per million write / read units) a year after AWS
halved them, so every dollar figure built on them was twice too high. A price lives here once,
with its unit, where it was read and when; ``tests/test_price_table.py`` fails when a bench or a
doc carries a price constant of its own, or a doc quotes a unit price that is not in this table.

All prices are us-east-1 (N. Virginia) on-demand list prices in US dollars, per ONE unit (one
request, one GB-second, ...), without free tiers or volume tiers beyond the first. A per-million
rate is ``rate("x") * 1e6``. Re-read the pages below when the date is more than a few months old.
"""

from __future__ import annotations

from dataclasses import dataclass

READ_ON = "2026-12-05"  # when the pages below were last read for this table
REGION = "us-east-1"


@dataclass(frozen=True)
class Price:
    usd: float  # per one ``unit``
    unit: str
    source: str  # the AWS pricing page the figure is read from (since: when it took effect, if known)


_PRICES: dict[str, Price] = {
    # DynamoDB on-demand, Standard table class; halved on 2024-11-01 (from $1.25 / $0.25 per million).
    # A transactional write or a strongly consistent read of the same size costs twice the units.
    "dynamodb_wru": Price(0.625e-6, "DynamoDB write request units",
                          "https://aws.amazon.com/dynamodb/pricing/on-demand/ (since 2024-11-01)"),
    "dynamodb_rru": Price(0.125e-6, "DynamoDB read request units",
                          "https://aws.amazon.com/dynamodb/pricing/on-demand/ (since 2024-11-01)"),
    # SQS standard queue, per request (each 64 KB chunk of a payload is one request).
    "sqs_request": Price(0.40e-6, "SQS requests", "https://aws.amazon.com/sqs/pricing/"),
    # S3 Standard.
    "s3_put": Price(5e-6, "S3 PUT requests", "https://aws.amazon.com/s3/pricing/"),
    "s3_get": Price(0.4e-6, "S3 GET requests", "https://aws.amazon.com/s3/pricing/"),
    # KMS: $0.03 per 10,000 requests (Decrypt, GenerateDataKey), beyond the free tier.
    "kms_request": Price(3e-6, "KMS requests", "https://aws.amazon.com/kms/pricing/"),
    "s3_gb_month": Price(0.023, "S3 Standard GB-month (first 50 TB)", "https://aws.amazon.com/s3/pricing/"),
    # Step Functions Standard workflows.
    "sfn_transition": Price(25e-6, "Step Functions state transitions", "https://aws.amazon.com/step-functions/pricing/"),
    # Lambda, arm64 (Graviton), first duration tier.
    "lambda_arm_gb_second": Price(0.0000133334, "Lambda arm64 GB-seconds", "https://aws.amazon.com/lambda/pricing/"),
    "lambda_request": Price(0.20e-6, "Lambda requests", "https://aws.amazon.com/lambda/pricing/"),
    # Fargate, Linux/ARM (Graviton).
    "fargate_arm_vcpu_hour": Price(0.03238, "Fargate ARM vCPU-hour", "https://aws.amazon.com/fargate/pricing/"),
    "fargate_arm_gb_hour": Price(0.00356, "Fargate ARM GB-hour", "https://aws.amazon.com/fargate/pricing/"),
    # API Gateway.
    "apigw_rest_request": Price(3.50e-6, "REST API requests",
                                "https://aws.amazon.com/api-gateway/pricing/"),
    "apigw_ws_message": Price(1.00e-6, "WebSocket messages of up to 32 KB",
                              "https://aws.amazon.com/api-gateway/pricing/"),
    "apigw_ws_connection_minute": Price(0.25e-6, "WebSocket connection minutes",
                                        "https://aws.amazon.com/api-gateway/pricing/"),
    # AppSync Events: an operation is a connection, a subscription, a published event or a
    # delivered event (AWS Price List: "$1 per million Event API operations").
    "appsync_events_operation": Price(1.00e-6, "AppSync Events operations",
                                      "https://aws.amazon.com/appsync/pricing/ (AWS Price List, AWSAppSync)"),
    "appsync_events_connection_minute": Price(0.08e-6, "AppSync Events connection minutes",
                                              "https://aws.amazon.com/appsync/pricing/"),
    # Application Load Balancer: an hour, and LCU-hours (the most of: 25 new connections/s,
    # 3,000 active connections/min, 1 GB processed/h for EC2/Fargate targets, 1,000 rule evaluations/s).
    "alb_hour": Price(0.0225, "Application Load Balancer hour", "https://aws.amazon.com/elasticloadbalancing/pricing/"),
    "alb_lcu_hour": Price(0.008, "Application Load Balancer LCU-hour",
                          "https://aws.amazon.com/elasticloadbalancing/pricing/"),
    # DynamoDB Streams read by a consumer of our own (Lambda triggers read it free): per GetRecords call.
    "dynamodb_streams_read": Price(0.02e-5, "DynamoDB Streams read request units",
                                   "https://aws.amazon.com/dynamodb/pricing/on-demand/"),
    # EC2 on-demand, Linux, m7g.large (2 Graviton3 vCPU, 8 GiB): the EC2 workspace tier's default
    # instance (infra/workspace_tier.py). Read 2026-12-05; billed per second, 60 s minimum.
    "ec2_m7g_large_hour": Price(0.0816, "EC2 m7g.large instance-hours (Linux, on-demand)",
                                "https://aws.amazon.com/ec2/pricing/on-demand/ (read 2026-12-05)"),
    # EBS gp3, per GB-month of provisioned size (3,000 IOPS and 125 MB/s included).
    "ebs_gp3_gb_month": Price(0.08, "EBS gp3 GB-months", "https://aws.amazon.com/ebs/pricing/ (read 2026-12-05)"),
    # NAT gateway: per hour it exists, and per GB it processes (the workers' way to the model APIs).
    "nat_gateway_hour": Price(0.045, "NAT gateway hours", "https://aws.amazon.com/vpc/pricing/ (read 2026-12-05)"),
    # Data transfer out to the internet, first 10 TB a month (AppSync and API Gateway bill EC2's).
    "data_out_gb": Price(0.09, "GB out to the internet", "https://aws.amazon.com/ec2/pricing/on-demand/"),
}  # fmt: skip


def price(name: str) -> Price:
    return _PRICES[name]


def rate(name: str) -> float:
    """Dollars per one unit of ``name``."""
    return _PRICES[name].usd


def per_million(name: str) -> float:
    return _PRICES[name].usd * 1e6


def names() -> list[str]:
    return list(_PRICES)


def dollars(usd: float) -> str:
    """$0.625, $0.40, $25.00, $0.0000133334: every digit the table has, at least two decimals."""
    text = f"{usd:.10f}".rstrip("0")
    whole, _, frac = text.partition(".")
    return f"${whole}.{frac.ljust(2, '0')}"


def quote(*keys: str) -> str:
    """'$0.625/M dynamodb_wru, ...' for a bench's footnote: the prices it used, from this table."""
    parts = []
    for key in keys:
        p = _PRICES[key]
        if p.usd < 1e-3:  # per-request prices read per million
            parts.append(f"{dollars(p.usd * 1e6)}/M {p.unit}")
        else:
            parts.append(f"{dollars(p.usd)} per {p.unit}")
    return f"{'; '.join(parts)} ({REGION} list prices read {READ_ON}, bench/_prices.py)"


def as_json(*keys: str) -> dict[str, object]:
    """The prices a bench used, for its --json: name -> dollars per unit, plus the table's date."""
    return {"read_on": READ_ON, "region": REGION, **{k: _PRICES[k].usd for k in keys}}
