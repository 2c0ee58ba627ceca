"""The webhook certificates hook of the hami chart, run by its Jobs inside the hami image.

`secret` (pre-install, pre-upgrade): make or renew the webhook's TLS Secret with `hami webhook certs`, reusing
the CA already in the Secret so that the caBundle registered with the API server stays valid.
`patch` (post-install, post-upgrade): copy the Secret's CA into the MutatingWebhookConfiguration's caBundle.

Arguments: MODE NAMESPACE SECRET SERVICE WEBHOOKCONFIG DAYS.
"""

import base64
import pathlib
import subprocess
import sys
import tempfile

from kubernetes import client, config

mode, namespace, secret_name, service, webhook_name, days = sys.argv[1:7]
config.load_incluster_config()
core = client.CoreV1Api()


def read_secret():
    try:
        return core.read_namespaced_secret(secret_name, namespace)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


if mode == "secret":
    out = pathlib.Path(tempfile.mkdtemp())
    existing = read_secret()
    if existing is not None and existing.data and "ca.key" in existing.data:
        for key in ("ca.crt", "ca.key"):
            (out / key).write_bytes(base64.b64decode(existing.data[key]))
    subprocess.run(
        ["hami", "webhook", "certs", "--service", service, "--namespace", namespace, "--out", str(out), "--days", days],
        check=True,
    )
    data = {k: base64.b64encode((out / k).read_bytes()).decode() for k in ("tls.crt", "tls.key", "ca.crt", "ca.key")}
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name=secret_name, namespace=namespace), type="kubernetes.io/tls", data=data
    )
    if existing is None:
        core.create_namespaced_secret(namespace, body)
    else:
        core.replace_namespaced_secret(secret_name, namespace, body)
    print(f"secret {namespace}/{secret_name} written")
elif mode == "patch":
    secret = read_secret()
    if secret is None:
        sys.exit(f"secret {namespace}/{secret_name} is missing: the pre-install certs job did not run")
    ca = secret.data["ca.crt"]
    admission = client.AdmissionregistrationV1Api()
    current = admission.read_mutating_webhook_configuration(webhook_name)
    patch = {"webhooks": [{"name": w.name, "clientConfig": {"caBundle": ca}} for w in current.webhooks]}
    admission.patch_mutating_webhook_configuration(webhook_name, patch)
    print(f"caBundle of {webhook_name} set from {namespace}/{secret_name}")
else:
    sys.exit(f"unknown mode {mode!r}: secret or patch")
