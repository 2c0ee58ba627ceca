"""The admission webhook's HTTPS face: `POST /mutate` (and HAMi's `/webhook`), `/healthz`, `/readyz`.

The transport (`hami.front`: TLS reloaded when the certificate files change, bounded bodies, time limits)
is shared with the scheduler extender; this module sets its limits for AdmissionReviews.

`WebhookApp.handle` is the whole protocol as a pure function of (method, path, body): a body that is not JSON
or not an AdmissionReview gets a 400 that says why, everything else an AdmissionReview answer from
`hami.webhook.admission`. It never raises; the tests fuzz it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from hami.front import JsonServer, ReloadingTLS
from hami.plugins import VendorPlugins
from hami.webhook.admission import AdmissionSettings, BadReview, LabelsOf, QuotaCheck, admit_review

__all__ = ["MAX_BODY_BYTES", "ReloadingTLS", "WebhookApp", "WebhookServer"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
"""An AdmissionReview carries one pod (at most about 1.5 MiB in etcd, twice that encoded); beyond this, 413."""

PATHS = ("/mutate", "/webhook")
"""`/webhook` is the path HAMi's own chart registers."""

Response = tuple[int, Any]


class WebhookApp:
    """The webhook protocol over the vendor plugins, a quota view and the namespaces' labels."""

    def __init__(
        self,
        plugins: VendorPlugins,
        *,
        settings: AdmissionSettings | None = None,
        quota: QuotaCheck | None = None,
        namespace_labels: LabelsOf | None = None,
        ready: Callable[[], bool] = lambda: True,
        observe: Callable[[bool, float], None] = lambda allowed, seconds: None,
        paths: Sequence[str] = PATHS,
    ) -> None:
        self.plugins = plugins
        self.settings = settings or AdmissionSettings()
        self.quota = quota
        self.namespace_labels = namespace_labels
        self.ready = ready
        self.observe = observe
        self.paths = tuple(paths)

    def handle(self, method: str, path: str, body: bytes) -> Response:
        route = path.split("?", 1)[0]
        if route == "/healthz" and method == "GET":
            return 200, {"status": "ok"}
        if route == "/readyz" and method == "GET":
            return (200, {"status": "ready"}) if self.ready() else (503, {"status": "syncing"})
        if route not in self.paths:
            return 404, {"error": f"no such endpoint {route}; POST an AdmissionReview to {self.paths[0]}"}
        if method != "POST":
            return 405, {"error": f"{route} takes POST"}
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as exc:
            return 400, {"error": f"the body is not JSON: {exc}"}
        start = time.perf_counter()
        try:
            answer = admit_review(
                data, self.plugins, settings=self.settings, quota=self.quota, namespace_labels=self.namespace_labels
            )
        except BadReview as exc:
            return 400, {"error": f"not an AdmissionReview this webhook can answer: {exc}"}
        self.observe(bool(answer["response"]["allowed"]), time.perf_counter() - start)
        return 200, answer


# --------------------------------------------------------------------------------------------------------
# TLS from files, reloaded when they change
# --------------------------------------------------------------------------------------------------------


class WebhookServer(JsonServer):
    """A threaded HTTPS (or, without a certificate, plain HTTP) server for a `WebhookApp`."""

    name = "webhook"
    max_body = MAX_BODY_BYTES
