package pserver

// InFlight is the number of calls cl has in flight.
func InFlight(cl *Client) int64 { return cl.life.count.Load() }
