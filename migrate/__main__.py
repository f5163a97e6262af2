from tfmigrate.cli import main

main()
