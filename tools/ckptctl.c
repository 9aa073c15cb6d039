/*
 * ckptctl.c - command-line tool for ckpt checkpoints: dispatch.
 *
 * Design note: the tool is a thin client of the public API (ckpt.h) and
 * nothing else, so anything it can do a user's program can do too. This
 * file only picks the command; each command lives in cmd_NAME.c with its
 * help text, and what they share (messages, option and DIR@STEP parsing,
 * JSON, progress, cancellation) is in cli.c. To add a command, write
 * cmd_NAME.c defining cli_cmd_NAME, declare it in cli.h, add it to
 * `commands` below and to meson.build; `ckptctl --help` lists it from the table.
 * Exit status of every command: 0 success, 1 failure (message on stderr),
 * 2 usage error. Every name read from a checkpoint or a safetensors file
 * is escaped before it reaches a terminal (st_escape); JSON output carries
 * the exact bytes.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "ckpt.h"
#include "cli.h"

/* In the order `ckptctl --help` lists them. */
static const struct cli_command *const commands[] = {
	&cli_cmd_ls,      &cli_cmd_inspect, &cli_cmd_verify, &cli_cmd_restore,
	&cli_cmd_push,    &cli_cmd_export,  &cli_cmd_import, &cli_cmd_gc,
	&cli_cmd_watch,   &cli_cmd_events,  &cli_cmd_run,    &cli_cmd_health,
	&cli_cmd_recover,
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void print_main_help(void)
{
	fputs("Usage: ckptctl [-h|--help] [-V|--version] COMMAND [ARGS]\n"
	      "       ckptctl help [COMMAND]\n"
	      "\n"
	      "Inspect, verify and convert ckpt checkpoints.\n"
	      "\n"
	      "Commands:\n",
	      stdout);
	for (size_t i = 0; i < NCOMMANDS; i++)
		printf("  %-7s  %s\n", commands[i]->name, commands[i]->summary);
	fputs("\n"
	      "Locations: DIR is a checkpoint root directory or gs://BUCKET/PREFIX\n"
	      "(Cloud Storage; every command but import, health and recover\n"
	      "takes one); DIR@STEP names one step (the last '@' followed by\n"
	      "digits only). Without @STEP, commands that read a step use the\n"
	      "latest one and import writes step 0. ls and gc take DIR whole.\n"
	      "health and recover take a Cloud TPU node (--node, --zone);\n"
	      "recover --yes also a journal --location.\n"
	      "\n"
	      "Exit status: 0 success, 1 failure, 2 usage error (health: 3 not\n"
	      "healthy).\n"
	      "Run 'ckptctl COMMAND --help' for a command's options and examples.\n",
	      stdout);
}

static const struct cli_command *find_command(const char *name)
{
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (strcmp(commands[i]->name, name) == 0)
			return commands[i];
	return NULL;
}

int main(int argc, char **argv)
{
	const struct cli_command *cmd;
	int ret;

	if (argc < 2)
		return cli_usage("missing command");
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		print_main_help();
		return 0;
	}
	if (!strcmp(argv[1], "-V") || !strcmp(argv[1], "--version")) {
		printf("ckptctl %d.%d.%d (libckpt %s, format version %d)\n",
		       CKPT_VERSION_MAJOR, CKPT_VERSION_MINOR,
		       CKPT_VERSION_PATCH, ckpt_version_string(),
		       CKPT_FORMAT_VERSION);
		return 0;
	}
	if (!strcmp(argv[1], "help")) {
		if (argc == 2) {
			print_main_help();
			return 0;
		}
		cmd = find_command(argv[2]);
		if (!cmd)
			return cli_usage("unknown command '%s'", argv[2]);
		fputs(cmd->help, stdout);
		return 0;
	}
	if (argv[1][0] == '-')
		return cli_usage("unknown option '%s'", argv[1]);
	cmd = find_command(argv[1]);
	if (!cmd)
		return cli_usage("unknown command '%s'", argv[1]);

	cli_cmd_name = cmd->name;
	opterr = 0;
	optind = 1;
	ret = cmd->fn(argc - 1, argv + 1);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		cli_err("error writing output: %s", strerror(errno));
		if (ret == 0)
			ret = 1;
	}
	return ret;
}
