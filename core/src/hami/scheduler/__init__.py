"""The scheduler extender: state from watches (`state`), decisions (`extender`), node locks (`locks`),
policies from annotations (`policy`), the HTTP protocol (`server`), and the running service (`service`)."""
