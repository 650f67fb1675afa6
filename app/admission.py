"""The MutatingWebhookConfiguration from deploy/webhook/, filled for an endpoint and a CA (pure)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def webhook_configuration(
    template: Mapping[str, Any], ca_bundle: str, url: str | None = None
) -> dict[str, Any]:
    """The template with each caBundle set; with `url`, clientConfig points there, not at a Service."""
    out = copy.deepcopy(dict(template))
    for hook in out["webhooks"]:
        client = hook["clientConfig"]
        if url is not None:
            client.pop("service", None)
            client["url"] = url
        client["caBundle"] = ca_bundle
    return out
