"""`hami doctor`: will it work on this node, in this container? Checks that each say ok, warning or failed, with the
one thing to do.

The package: `hami.findings` (what a check says, exit status, rendering), `hami.vendorchecks` (the
checks vendors build their `hami_doctor_checks` from), `hami.doctor.node` (core's node checks),
`hami.doctor.container` (what the isolation library sees in a container), `hami.doctor.remote` (the node daemon's
view through the cluster, `--node`) and `hami.doctor.cli` (the command). This module imports nothing, so that the
vendor contract (`hami.hookspecs`) can name `Finding` without loading the checks.
"""
