"""`hami demo`: the whole system on one machine, with no cluster and no accelerator, in under a minute.

    examples  the example files: pod specs (submitted in file order) and the objects they need first
              (namespaces, resource quotas)
    world     what runs: the in-memory cluster served over HTTP (`hami.testing.apiserver`), the real scheduler
              process (extender and admission webhook, `hami scheduler`), one real node daemon process per
              node (`hami node --simulated-inventory`) with a fake kubelet (`hami.testing.kubelet`) each
    journey   one pod's way through it, as a cluster would take it: the webhook's AdmissionReview (HTTPS),
              the pod created, the extender's filter and bind (HTTP), the kubelet's Allocate per container
              (gRPC over the node daemon's unix socket); what happened at each step
    cli       `hami demo` (`add_demo_parser`): the flags, the printing, `--json`, `--keep`

The demo plays only the parts of Kubernetes a laptop lacks (kube-apiserver's storage and admission call,
kube-scheduler's calls to the extender, the kubelet's device-plugin calls); every HAMi component is the real
one, in its own process, talking to the others over the same protocols as on a cluster. It must not
contain scheduling or device logic of its own.
"""
