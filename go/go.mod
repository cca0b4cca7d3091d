module github.com/pserver-project/pserver/go

go 1.19
