from kernelbrain.cli import main

main(prog_name="kb")
