# The agentq worker image (ECS Fargate, `agentq worker`). CDK builds it at deploy time when
# cdk.json's worker.image is null (infra/worker.py), with your tools: USER_CODE_DIR (a folder
# relative to this one, put on the Python path) and USER_REQUIREMENTS (its requirements.txt).
# By hand:  docker build -t agentq-worker .   (or with --build-arg USER_CODE_DIR=examples/shop)
ARG PYTHON_IMAGE=public.ecr.aws/docker/library/python:3.12-slim
FROM ${PYTHON_IMAGE}

ARG USER_CODE_DIR=""
ARG USER_REQUIREMENTS=""
# "otel" when cdk.json's tracing.exporter is "adot" (infra/worker.py): agentq[otel]
ARG AGENTQ_EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/agentq
COPY pyproject.toml README.md ./
COPY requirements/constraints.txt ./requirements/constraints.txt
COPY layers/agentq/python ./layers/agentq/python
# The versions the suite was proven with (requirements/constraints.txt), as `make` installs them.
RUN pip install --no-compile -c requirements/constraints.txt pip setuptools && \
    pip install --no-compile -c requirements/constraints.txt --build-constraint requirements/constraints.txt \
    ".${AGENTQ_EXTRAS:+[$AGENTQ_EXTRAS]}"

# Your code: copied whole (the build context is the project), then only its folder is kept.
COPY . /tmp/context
RUN set -e; mkdir -p /opt/user_code; \
    if [ -n "$USER_CODE_DIR" ]; then cp -r "/tmp/context/$USER_CODE_DIR/." /opt/user_code/; fi; \
    if [ -n "$USER_REQUIREMENTS" ]; then pip install --no-compile -r "/tmp/context/$USER_REQUIREMENTS"; fi; \
    rm -rf /tmp/context
ENV PYTHONPATH=/opt/user_code

# nobody: the task definition runs it as 65534 with a read-only root filesystem
USER 65534:65534
ENTRYPOINT []
CMD ["agentq", "worker"]
