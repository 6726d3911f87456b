#!/usr/bin/env python3
"""Regenerates the AWS Lambda event fixtures in this folder (standard library only).

The signed deliveries carry the compact JSON of
`../webhooks/agent.session.action_required.environment_connection.json`, signed with the
TEST-ONLY secret below at the fixed timestamp `WEBHOOK_TIMESTAMP` (see ../README.md).
Run it after editing that webhook fixture:

    python3 events/lambda/regenerate.py

Output is deterministic: running it twice gives identical files.
"""

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WEBHOOKS = HERE.parent / "webhooks"

# TEST-ONLY secret: 32 random bytes, never used anywhere but these fixtures and tests.
TEST_WEBHOOK_SECRET = "whsec_d0jBWkxw8kwXPSTcgFkLyF4RsJ2W0Xo2SjxObaPtVAc="
WEBHOOK_ID = "msg_O2MN9PnX7Re6gTtNH0lPGi7zL91"
WEBHOOK_TIMESTAMP = 1764400000  # 2025-11-29T07:06:40Z

ACCOUNT = "123456789012"
REGION = "us-east-1"
SOURCE_IP = "203.0.113.24"  # TEST-NET-3 (documentation range)
USER_AGENT = "OpenAI/1.0 (+https://platform.openai.com/docs/webhooks)"
PATH = "/webhooks/openai"


def sign(secret: str, msg_id: str, ts: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def clf_time(epoch_ms: int) -> str:
    """requestContext.time: `29/Nov/2025:07:06:40 +0000`."""
    return time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(epoch_ms // 1000))


def trace_id(epoch_s: int, tail: str) -> str:
    return f"Root=1-{epoch_s:08x}-{tail}"


def write(name: str, obj: dict) -> None:
    with open(HERE / name, "w") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def delivery():
    event = json.loads((WEBHOOKS / "agent.session.action_required.environment_connection.json").read_text())
    body = json.dumps(event, separators=(",", ":")).encode()
    return event, body, sign(TEST_WEBHOOK_SECRET, WEBHOOK_ID, WEBHOOK_TIMESTAMP, body)


def http_headers(host: str, body: bytes, signature: str, trace_tail: str, function_url: bool) -> dict:
    headers = {
        "content-length": str(len(body)),
        "content-type": "application/json",
        "host": host,
        "user-agent": USER_AGENT,
        "webhook-id": WEBHOOK_ID,
        "webhook-signature": signature,
        "webhook-timestamp": str(WEBHOOK_TIMESTAMP),
    }
    if function_url:
        headers["x-amzn-tls-cipher-suite"] = "TLS_AES_128_GCM_SHA256"
        headers["x-amzn-tls-version"] = "TLSv1.3"
    headers.update({
        "x-amzn-trace-id": trace_id(WEBHOOK_TIMESTAMP, trace_tail),
        "x-forwarded-for": SOURCE_IP,
        "x-forwarded-port": "443",
        "x-forwarded-proto": "https",
    })
    return headers


def function_url_event(body: bytes, signature: str) -> dict:
    url_id = "k3u7xq2mbw5vc4ydgzr6hsnf8e0tjpla"
    host = f"{url_id}.lambda-url.{REGION}.on.aws"
    epoch_ms = WEBHOOK_TIMESTAMP * 1000 + 123
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": PATH,
        "rawQueryString": "",
        "headers": http_headers(host, body, signature, "4f1c9a2e7b3d8e6f0a5c2b19", True),
        "requestContext": {
            "accountId": "anonymous",
            "apiId": url_id,
            "domainName": host,
            "domainPrefix": url_id,
            "http": {
                "method": "POST",
                "path": PATH,
                "protocol": "HTTP/1.1",
                "sourceIp": SOURCE_IP,
                "userAgent": USER_AGENT,
            },
            "requestId": "6f9e2c41-8b7a-4d3e-9c15-2a0b7e4d1f63",
            "routeKey": "$default",
            "stage": "$default",
            "time": clf_time(epoch_ms),
            "timeEpoch": epoch_ms,
        },
        "body": base64.b64encode(body).decode(),
        "isBase64Encoded": True,
    }


def apigw_v2_event(body: bytes, signature: str) -> dict:
    api_id = "r2d4f6h8j0"
    host = f"{api_id}.execute-api.{REGION}.amazonaws.com"
    epoch_ms = WEBHOOK_TIMESTAMP * 1000 + 187
    route = f"POST {PATH}"
    return {
        "version": "2.0",
        "routeKey": route,
        "rawPath": PATH,
        "rawQueryString": "",
        "headers": http_headers(host, body, signature, "8c2e5a7f1b9d3c6e0f4a8b27", False),
        "requestContext": {
            "accountId": ACCOUNT,
            "apiId": api_id,
            "domainName": host,
            "domainPrefix": api_id,
            "http": {
                "method": "POST",
                "path": PATH,
                "protocol": "HTTP/1.1",
                "sourceIp": SOURCE_IP,
                "userAgent": USER_AGENT,
            },
            "requestId": "Uq7xJgKfoAMESbQ=",
            "routeKey": route,
            "stage": "$default",
            "time": clf_time(epoch_ms),
            "timeEpoch": epoch_ms,
        },
        "body": base64.b64encode(body).decode(),
        "isBase64Encoded": True,
    }


def sqs_record(message_id, receipt, job, sent_ms, seq) -> dict:
    body = json.dumps(job, separators=(",", ":"))
    return {
        "messageId": message_id,
        "receiptHandle": receipt,
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": str(sent_ms),
            "SequenceNumber": seq,
            "MessageGroupId": job["environment_id"],
            "SenderId": "AROAXYKJUIW3EXAMPLE7Q:sandbox-lifecycle-webhook",
            "MessageDeduplicationId": job["webhook_id"],
            "ApproximateFirstReceiveTimestamp": str(sent_ms + 41),
        },
        "messageAttributes": {},
        "md5OfBody": hashlib.md5(body.encode()).hexdigest(),
        "eventSource": "aws:sqs",
        "eventSourceARN": f"arn:aws:sqs:{REGION}:{ACCOUNT}:sandbox-lifecycle-jobs.fifo",
        "awsRegion": REGION,
    }


def sqs_event(event: dict) -> dict:
    first = {
        "kind": "webhook",
        "webhook_id": WEBHOOK_ID,
        "session_id": event["data"]["id"],
        "environment_id": "env_8749d36b79c63105ff2ea2e3",
        "event_type": "agent.session.action_required",
        "action": "environment_connection",
        "received_at": WEBHOOK_TIMESTAMP,
    }
    second = {
        "kind": "webhook",
        "webhook_id": "msg_NKS4mowbgmPtmpcvKKlW2ITizf2",
        "session_id": "sess_0f4c2a7e9b1d3f5a7c9e1b3d",
        "environment_id": "env_6e8a0c2e4f6a8c0e2a4c6e8a",
        "event_type": "agent.session.action_required",
        "action": "environment_connection",
        "received_at": WEBHOOK_TIMESTAMP + 3,
    }
    return {
        "Records": [
            sqs_record(
                "0b6e2f1a-93c4-4d5e-8f7a-1c2b3d4e5f60",
                "AQEBzWwaftRI0KuVm4tP+/7q1rGgNqicHq9fpUdXPe8sLm0DtqZNbBUH5v4Zw6gZPkdZ8o2mq1nUGoAUvQ4x5s7Q==",
                first,
                WEBHOOK_TIMESTAMP * 1000 + 412,
                "18899442132871936000",
            ),
            sqs_record(
                "7d3a9c5e-1f2b-4a6c-9e8d-0b1a2c3d4e5f",
                "AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a+xhQ9KdLgG8wRfY2uVKz1MGJ0rWsEY8T3oBpz6yX1m9cQiNnPa5fHdA==",
                second,
                (WEBHOOK_TIMESTAMP + 3) * 1000 + 96,
                "18899442132871936001",
            ),
        ]
    }


def scheduled_event() -> dict:
    return {
        "version": "0",
        "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT,
        "time": "2025-11-29T07:10:00Z",
        "region": REGION,
        "resources": [f"arn:aws:events:{REGION}:{ACCOUNT}:rule/sandbox-lifecycle-reconcile"],
        "detail": {},
    }


def main() -> None:
    event, body, signature = delivery()
    write("function_url.action_required.json", function_url_event(body, signature))
    write("apigw_http_v2.action_required.json", apigw_v2_event(body, signature))
    write("sqs_fifo.jobs.json", sqs_event(event))
    write("eventbridge.scheduled.json", scheduled_event())


if __name__ == "__main__":
    main()
