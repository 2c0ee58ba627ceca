"""The mutating admission webhook: pods asking for shared devices go to this scheduler, with their vendors'
defaults applied and namespace quotas on device memory and cores enforced.

`admission` decides (pure), `quota` counts (watch-fed), `server` speaks HTTPS with reloadable certificates,
`certs` makes certificates for clusters without cert-manager, `run` and `cli` are `hami webhook`.
"""
