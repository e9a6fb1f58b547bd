package tracestore

import "embed"

// uiFiles is the web page: plain HTML, CSS and JavaScript, no build step.
//
//go:embed ui
var uiFiles embed.FS
