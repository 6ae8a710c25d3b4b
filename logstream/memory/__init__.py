"""The incident memory: every alert group kept with what operators said about it, and
retrieval of the past incidents most like a new one (store, retrieval, embedding, cli)."""
