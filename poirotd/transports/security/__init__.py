"""What every transport of the daemon shares to be locked: TLS material that follows rotation, who a
client is and what its roles let it call, the record of each refusal, and the start-up check that
no port is open to the network unlocked. Each transport applies them in its own protocol's way."""
