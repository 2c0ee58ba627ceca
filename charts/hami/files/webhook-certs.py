"""The webhook certificates hook of the hami chart, run by its Jobs inside the hami image.

`secret` (pre-install, pre-upgrade): make or renew the webhook's TLS Secret with `hami webhook certs`, keeping
the CA in its own Secret (CASECRET) that only this Job reads, so that the caBundle registered with the API server
stays valid and the serving Secret, which the scheduler mounts, never holds the CA's private key. A CA key left
in the serving Secret by an earlier chart version is moved to the CA Secret and dropped from the serving one.
`patch` (post-install, post-upgrade): copy the Secret's CA into the MutatingWebhookConfiguration's caBundle.

Arguments: MODE NAMESPACE SECRET SERVICE WEBHOOKCONFIG DAYS CASECRET. Credentials: the Job's ServiceAccount (outside
a cluster, the usual kubeconfig: the end-to-end suite runs the hook Jobs this way).
"""

import base64
import pathlib
import subprocess
import sys
import tempfile

from kubernetes import client, config

mode, namespace, secret_name, service, webhook_name, days, ca_secret_name = sys.argv[1:8]
try:
    config.load_incluster_config()
except config.ConfigException:
    config.load_kube_config()
core = client.CoreV1Api()


def read_secret(name=None):
    try:
        return core.read_namespaced_secret(name or secret_name, namespace)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def write_secret(name, existing, data, kind):
    body = client.V1Secret(metadata=client.V1ObjectMeta(name=name, namespace=namespace), type=kind, data=data)
    if existing is None:
        core.create_namespaced_secret(namespace, body)
    else:
        core.replace_namespaced_secret(name, namespace, body)


if mode == "secret":
    out, ca_dir = pathlib.Path(tempfile.mkdtemp()), pathlib.Path(tempfile.mkdtemp())
    existing = read_secret()
    existing_ca = read_secret(ca_secret_name)
    for source in (existing_ca, existing):  # the CA Secret first; an older chart's serving Secret held the key
        if source is not None and source.data and "ca.key" in source.data and "ca.crt" in source.data:
            for key in ("ca.crt", "ca.key"):
                (ca_dir / key).write_bytes(base64.b64decode(source.data[key]))
            break
    subprocess.run(
        [
            "hami",
            "webhook",
            "certs",
            "--service",
            service,
            "--namespace",
            namespace,
            "--out",
            str(out),
            "--ca-dir",
            str(ca_dir),
            "--days",
            days,
        ],
        check=True,
    )
    ca = {k: base64.b64encode((ca_dir / k).read_bytes()).decode() for k in ("ca.crt", "ca.key")}
    write_secret(ca_secret_name, existing_ca, ca, "Opaque")
    serving = {k: base64.b64encode((out / k).read_bytes()).decode() for k in ("tls.crt", "tls.key", "ca.crt")}
    write_secret(secret_name, existing, serving, "kubernetes.io/tls")
    print(f"secret {namespace}/{secret_name} written (its CA kept in {namespace}/{ca_secret_name})")
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
