"""The API's routes by area, each a powertools router that ``agentq.api.app`` includes:
``meta`` (health, the OpenAPI document), ``tasks`` (submit and read), ``actions`` (what a
caller does to a task: cancel, approve, reject, budget, fork). ``common`` is what they share."""
