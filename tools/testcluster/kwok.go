package main

import (
	"os"

	"github.com/spf13/pflag"

	"sigs.k8s.io/kwok/pkg/config"
	"sigs.k8s.io/kwok/pkg/kwok/cmd"
	"sigs.k8s.io/kwok/pkg/log"
	"sigs.k8s.io/kwok/pkg/utils/signals"
)

// runKwok starts kwok's controller the way its own command does (sigs.k8s.io/kwok: cmd/kwok/main.go
// @ v0.8.0): logging and --config flags are parsed before the cobra command is built.
func runKwok() {
	// k8s.io/component-base/version/verflag registers a non-bool --version on pflag.CommandLine
	// when the Kubernetes components are linked in; cobra merges that set into kwok's command and
	// then fails every run reading its own --version as a bool. kwok parses its flags without it.
	withoutVersion := pflag.NewFlagSet(os.Args[0], pflag.ExitOnError)
	pflag.CommandLine.VisitAll(func(f *pflag.Flag) {
		if f.Name != "version" {
			withoutVersion.AddFlag(f)
		}
	})
	pflag.CommandLine = withoutVersion

	flags := pflag.NewFlagSet("global", pflag.ContinueOnError)
	flags.ParseErrorsAllowlist.UnknownFlags = true
	flags.Usage = func() {}

	ctx := signals.SetupSignalContext()
	ctx, logger := log.InitFlags(ctx, flags)
	ctx, err := config.InitFlags(ctx, flags)
	if err != nil {
		logger.Error("Init config flags", "err", err)
		os.Exit(1)
	}
	command := cmd.NewCommand(ctx)
	command.PersistentFlags().AddFlagSet(flags)
	if err := command.ExecuteContext(ctx); err != nil {
		logger.Error("Execute exit", "err", err)
		os.Exit(1)
	}
}
