"""Validation gates: prove on the live service that DDTree is wired right, lossless and faster.

`client` speaks SGLang's HTTP API, `measure` answers the prompt set, `gates` judges (pure),
`probes` polls the first gates against a host, `tunnel` reaches the port. `rollout` orders them.
"""
