"""The `webhook` section of the configuration: where the webhook listens, its certificate, and how it decides.

Owns the section's shape and validation only (the same conventions as `hami.config`: camelCase keys,
unknown keys refused). `hami.config.HamiConfig` is meant to carry it as `webhook`:

    webhook:
      enabled: false                    # also serve the webhook from `hami scheduler`
      listen: 0.0.0.0:9443
      tls: {certFile: /tls/tls.crt, keyFile: /tls/tls.key}
      schedulerName: hami-scheduler
      overwriteDefaultScheduler: true   # `default-scheduler` counts as naming no scheduler
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hami.config import TLSConfig, parse_address
from hami.webhook.admission import DEFAULT_SCHEDULER_NAME, AdmissionSettings

__all__ = ["WebhookConfig"]


class WebhookConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    enabled: bool = Field(default=False, description="serve the webhook from the scheduler process as well")
    listen: str = Field(default="0.0.0.0:9443", description="the HTTPS address")
    tls: TLSConfig | None = Field(default=None, description="certificate and key files, reloaded when they change")
    scheduler_name: str = Field(default=DEFAULT_SCHEDULER_NAME, alias="schedulerName", min_length=1)
    overwrite_default_scheduler: bool = Field(default=True, alias="overwriteDefaultScheduler")

    @field_validator("listen")
    @classmethod
    def _address(cls, value: str) -> str:
        parse_address(value)
        return value

    def admission(self) -> AdmissionSettings:
        return AdmissionSettings(
            scheduler_name=self.scheduler_name, overwrite_default_scheduler=self.overwrite_default_scheduler
        )
