"""Every ``kq`` subcommand, one module each: thin adapters that parse flags,
call a library function and print (``--json`` where it applies).
:data:`kq.cli.COMMANDS` lists them; :mod:`kq.commands.common` holds what
they share."""
