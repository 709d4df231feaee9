"""The chaos harness: fakes of the outside world, fault injection and the runs that prove the engine."""
from chaos.commands.interrupts import quiet_when_a_command

quiet_when_a_command("chaos", ("ninelives",))  # first: a command interrupted while it imports
