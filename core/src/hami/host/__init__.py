"""Isolation without Kubernetes: the vendors' isolation libraries for a process tree or a host's own runtimes.

The same mechanism a container gets from the node daemon, on a host of its own (a workstation, a batch host, a
Cloudpods host):

* `hami.host.run`: ``hami run`` runs a command and every process it starts under a vendor's library with a grant
  (the vendor's own ``hami_container_edits``, translated from mounts to host paths); ``hami host grant`` writes
  such a grant for containers and prints those edits as container-engine flags;
* `hami.host.confine`: as root, the command's private mount namespace (``/etc/ld.so.preload`` and
  ``/etc/hami/grant`` read-only, as in a container), the change to the command's user, and the seccomp filter
  that keeps it from building a user namespace to mount over them;
* `hami.host.install`: ``hami host install`` (the libraries under versioned paths, the preload and runtime
  configuration) and ``hami host status`` (each grant's usage, from its accounting file);
* `hami.host.cli`: the commands' parsers.

Nothing here names a vendor: what differs between vendors comes through their hooks.
"""
