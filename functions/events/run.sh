#!/bin/sh
# The Lambda Web Adapter (AWS_LAMBDA_EXEC_WRAPPER=/opt/bootstrap) starts this, then forwards each
# invocation to the server as an HTTP request and streams its answer back (functions/events/server.py).
export PYTHONPATH="/opt/python:${LAMBDA_TASK_ROOT:-/var/task}:${PYTHONPATH}"
exec python3 "${LAMBDA_TASK_ROOT:-/var/task}/events/server.py"
