"""hami-core: heterogeneous accelerator sharing for Kubernetes, wire-compatible with HAMi v2.10.

Start here: `hami.hookspecs` is the vendor contract, `hami.model` the data every part speaks, `hami.codec`
HAMi's annotation formats, `hami.plugins` the host that loads vendor plugins, `hami.testing` the kit plugin
authors test with. A vendor plugin marks its hook implementations with `hami.hookimpl`.
"""

from hami.hookspecs import hookimpl

__all__ = ["__version__", "hookimpl"]

__version__ = "0.1.0"
