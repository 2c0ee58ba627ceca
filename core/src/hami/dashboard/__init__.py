"""The web dashboard: the cluster's devices, who shares them and how full they are, live, read-only.

`hami.dashboard.views` computes each page's figures from one read of the cluster (over `hami.status`, the
accounting `hami status` prints); `hami.dashboard.source` reads the cluster and keeps history;
`hami.dashboard.app` renders and serves the pages; `hami.dashboard.cli` is `hami dashboard`. `hami scheduler`
serves the same app when `scheduler.dashboardListen` is set. It imports no service: the scheduler imports it.
"""
