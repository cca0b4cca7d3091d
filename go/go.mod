module pserver

go 1.19
