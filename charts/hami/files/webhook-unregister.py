"""The pre-delete hook of the hami chart, run by its Job inside the hami image before Helm removes anything.

Helm deletes kinds it does not know last, so without this hook the MutatingWebhookConfiguration would outlive the
webhook's Service and Deployment, and with `failurePolicy: Fail` the API server would reject every new pod until
it went too. Deleting it first closes that window; a configuration already gone is not an error.

The webhook's certificate Secrets, which the certificates Job made (not Helm, so Helm would leave them behind), go
after it.

Arguments: WEBHOOKCONFIG [NAMESPACE SECRET...]. Credentials: the Job's ServiceAccount (outside a cluster, the usual
kubeconfig).
"""

import sys

from kubernetes import client, config

webhook_name, *rest = sys.argv[1:]
namespace, secrets = (rest[0], rest[1:]) if rest else ("", [])
try:
    config.load_incluster_config()
except config.ConfigException:
    config.load_kube_config()


def delete(what, call, *args):
    try:
        call(*args)
        print(f"deleted {what}")
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        print(f"{what} was already gone")


delete(
    f"MutatingWebhookConfiguration {webhook_name}",
    client.AdmissionregistrationV1Api().delete_mutating_webhook_configuration,
    webhook_name,
)
for secret in secrets:
    delete(f"Secret {namespace}/{secret}", client.CoreV1Api().delete_namespaced_secret, secret, namespace)
