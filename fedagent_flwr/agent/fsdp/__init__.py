"""FSDP2's room: one client's local round on N ranks (run-config engine.ranks-per-client).

- ranks.py   what the ranks share inside a round: each rank's stride of the samples, the collectives that keep them in
             step (most, total, gather), the micro-batch plan of a pass on N ranks, FSDP2's sharding and unsharding
- launch.py  starting a client's rank processes, the rendezvous, tensors in and out, ending them with the client

Imports nothing else of the agent (a model built on each rank with its own shard only is the models room's:
agent/models/sharded_load.py). Its one caller above the agent is methods/ranked_round.py, the round a rank runs: that
needs the run config and the client's round (methods/local_round.py), which live with the methods.
"""
