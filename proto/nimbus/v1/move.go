package nimbusv1

// MoveTrailer is the trailer of a Watch stream that a nimbus replica ends, with
// codes.Unavailable, to ask the agent to watch another replica: it holds more than its
// share of the agents (docs/replicas.md, "Rebalancing"). Its value is the address of the
// replica it suggests, as the replicas reach each other (nimbus --advertise). The agent
// then watches, and reports to, another replica than the one that asked, the suggested one
// when it knows that address and it is ready, and resumes there.
const MoveTrailer = "naples-move"
