"""The MutatingWebhookConfiguration from deploy/webhook/, filled for an endpoint and a CA (pure)."""

from __future__ import annotations

import copy
import urllib.parse
from collections.abc import Mapping
from typing import Any


def webhook_configuration(
    template: Mapping[str, Any], ca_bundle: str, url: str | None = None
) -> dict[str, Any]:
    """The template with each caBundle set; with `url`, clientConfig points there, not at a Service: at
    `url`'s host and port, with the path of each entry's service (the entries differ in path)."""
    out = copy.deepcopy(dict(template))
    for hook in out["webhooks"]:
        client = hook["clientConfig"]
        if url is not None:
            service = client.pop("service", None) or {}
            parts = urllib.parse.urlsplit(url)
            client["url"] = urllib.parse.urlunsplit(parts._replace(path=service.get("path") or parts.path))
        client["caBundle"] = ca_bundle
    return out
