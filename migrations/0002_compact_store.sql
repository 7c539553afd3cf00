CREATE TABLE `exchange_bodies` (
	`exchange_id` integer PRIMARY KEY NOT NULL,
	`request_body` blob,
	`response_body` blob,
	`event_ends` blob NOT NULL,
	`event_times` blob NOT NULL,
	`event_tokens` blob NOT NULL,
	FOREIGN KEY (`exchange_id`) REFERENCES `exchanges`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
CREATE TABLE `prompt_nodes` (
	`id` integer PRIMARY KEY NOT NULL,
	`parent` integer,
	`first_token` integer,
	`model` text,
	`tokens` blob NOT NULL,
	`newest` integer NOT NULL
);
--> statement-breakpoint
CREATE UNIQUE INDEX `prompt_nodes_child` ON `prompt_nodes` (`parent`,`first_token`) WHERE parent is not null;--> statement-breakpoint
CREATE UNIQUE INDEX `prompt_nodes_root` ON `prompt_nodes` (`model`) WHERE model is not null;--> statement-breakpoint
ALTER TABLE `exchanges` ADD `encoding` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `exchanges` ADD `prompt_node` integer;