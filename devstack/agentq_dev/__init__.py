"""agentq's development stack: the whole system on one machine, on moto in server mode.

What ``agentq dev``, ``agentq demo``, ``agentq run``, the tests and the benches run; nothing here
runs in AWS. It lives apart from ``agentq`` (``layers/agentq/python``, the Lambda layer and the
worker image) so that what AWS runs carries no moto patches, fork server or demo: the layer CDK
builds holds no file of it (``tests/test_cdk_layers.py``), ``agentq`` imports it only in the CLI's
local-stack commands (``agentq.cli.local``; pyproject's import contract), and every module of
``agentq`` imports without it (``tests/test_dev_stack_apart.py``). It is installed with agentq
from the repository (pyproject's ``packages.find``), its moto with the ``local`` extra.

- ``stack`` (``LocalStack``): moto, the production resources (``agentq.resources.provision``),
  N worker processes and the API server (``agentq.api.http_server``, as the ``events`` function
  runs it in AWS) on localhost; ``fleet`` keeps its workers up; ``reload`` is ``agentq dev --reload``.
- ``demo``: ``agentq demo`` (a scripted agent, its worker SIGKILLed mid-task, resumed) and ``agentq run``.
- ``moto_server`` (moto as a child process), ``moto_app`` (the server program: DynamoDB requests
  serialised, memory bounded, the fast paths installed) and its patches of moto's internals,
  ``moto_*``, each verified against one moto release (``moto_version``).
- ``forkserver``: forks moto servers, workers and the test suite's own processes warm.
"""
