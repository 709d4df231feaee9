"""The chaos harness: fakes of the outside world, fault injection and the runs that prove the
engine. What an adapter imports lies at the top (contract, history, pipeline, probe, sqlite);
the harness's parts are packages (docs/explanation/layout.md)."""
from chaos.commands.interrupts import quiet_when_a_command

quiet_when_a_command("chaos", ("ninelives",))  # first: a command interrupted while it imports
