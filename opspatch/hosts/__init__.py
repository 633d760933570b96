"""Effects on one host: the transports (`transport/`: SSH and local), the host agent that runs
on the host (`agent`), the typed operations built on it (`operations`: inspect, swap, restore,
lock), engine control (`engine`: restart, readiness, smoke decode) and a host's incident facts in
one exec (`diagnosis`: what `opspatch diagnose` and `lint-init --hosts` read)."""
