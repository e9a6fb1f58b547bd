package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"

	"github.com/ardanlabs/jinja"
)

// maxValueDepth bounds the nesting of a value handed to a template (it also stops a Go map or
// slice that contains itself).
const maxValueDepth = 256

// messageValue converts a message to the dict the template sees: role and content always, then
// tool_call_id, name and tool_calls when set — in that order, which is the order tojson prints.
func messageValue(m Message) (jinja.Value, error) {
	v := jinja.NewDict()
	d := v.AsDict()
	d.Set("role", jinja.NewString(m.Role))
	d.Set("content", jinja.NewString(m.Content))
	if m.ToolCallID != "" {
		d.Set("tool_call_id", jinja.NewString(m.ToolCallID))
	}
	if m.Name != "" {
		d.Set("name", jinja.NewString(m.Name))
	}
	if len(m.ToolCalls) > 0 {
		calls, err := decodeJSON(m.ToolCalls)
		if err != nil {
			return jinja.Undefined(), err
		}
		d.Set("tool_calls", calls)
	}
	return v, nil
}

// toValue converts a Go value for the template. Supported: nil, bool, integer and float kinds,
// string, json.Number, json.RawMessage (decoded keeping the document's key order), slices and
// arrays, and maps with string keys (keys sorted, as the order of a Go map is unspecified).
// Anything else is an error rather than a silently undefined variable.
func toValue(x any, depth int) (jinja.Value, error) {
	if depth > maxValueDepth {
		return jinja.Undefined(), fmt.Errorf("nested deeper than %d", maxValueDepth)
	}
	switch v := x.(type) {
	case nil:
		return jinja.None(), nil
	case string:
		return jinja.NewString(v), nil
	case bool:
		return jinja.NewBool(v), nil
	case int:
		return jinja.NewInt(int64(v)), nil
	case int64:
		return jinja.NewInt(v), nil
	case float64:
		return jinja.NewFloat(v), nil
	case json.Number:
		return numberValue(v)
	case json.RawMessage:
		return decodeJSON(v)
	case []any: // a nil []any is an empty list (reflectValue makes other nil slices none)
		return listValue(len(v), func(i int) any { return v[i] }, depth)
	}
	return reflectValue(reflect.ValueOf(x), depth)
}

// listValue converts the n items item(0), item(1), ... to a list.
func listValue(n int, item func(int) any, depth int) (jinja.Value, error) {
	items := make([]jinja.Value, n)
	for i := range items {
		ev, err := toValue(item(i), depth+1)
		if err != nil {
			return ev, err
		}
		items[i] = ev
	}
	return jinja.NewList(items), nil
}

// reflectValue converts the kinds toValue does not list by type (maps
// included).
func reflectValue(rv reflect.Value, depth int) (jinja.Value, error) {
	switch rv.Kind() {
	case reflect.Bool:
		return jinja.NewBool(rv.Bool()), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return jinja.NewInt(rv.Int()), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		u := rv.Uint()
		if u > math.MaxInt64 {
			return jinja.NewFloat(float64(u)), nil
		}
		return jinja.NewInt(int64(u)), nil
	case reflect.Float32, reflect.Float64:
		return jinja.NewFloat(rv.Float()), nil
	case reflect.String:
		return jinja.NewString(rv.String()), nil
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return jinja.None(), nil
		}
		return toValue(rv.Elem().Interface(), depth+1)
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			return jinja.None(), nil
		}
		return listValue(rv.Len(), func(i int) any { return rv.Index(i).Interface() }, depth)
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			break
		}
		keys := make([]string, 0, rv.Len())
		for _, k := range rv.MapKeys() {
			keys = append(keys, k.String())
		}
		slices.Sort(keys)
		out := jinja.NewDict()
		d := out.AsDict()
		for _, k := range keys {
			ev, err := toValue(rv.MapIndex(reflect.ValueOf(k).Convert(rv.Type().Key())).Interface(), depth+1)
			if err != nil {
				return ev, err
			}
			d.Set(k, ev)
		}
		return out, nil
	}
	return jinja.Undefined(), fmt.Errorf("unsupported type %s", rv.Type())
}

// numberValue converts a JSON number: an integer literal that fits int64 becomes an int, anything
// else a float.
func numberValue(n json.Number) (jinja.Value, error) {
	if i, err := n.Int64(); err == nil {
		return jinja.NewInt(i), nil
	}
	f, err := n.Float64()
	if err != nil {
		return jinja.Undefined(), fmt.Errorf("bad number %q", string(n))
	}
	return jinja.NewFloat(f), nil
}

// decodeJSON decodes one JSON document into a template value, keeping object keys in document
// order (a repeated key keeps its first position and its last value, as in JavaScript).
func decodeJSON(data []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeJSONValue(dec, 0)
	if err != nil {
		return v, fmt.Errorf("json: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return jinja.Undefined(), errors.New("json: data after the value")
	}
	return v, nil
}

func decodeJSONValue(dec *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxValueDepth {
		return jinja.Undefined(), fmt.Errorf("nested deeper than %d", maxValueDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(t), nil
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		return numberValue(t)
	case json.Delim:
		switch t {
		case '[':
			var items []jinja.Value
			for dec.More() {
				ev, err := decodeJSONValue(dec, depth+1)
				if err != nil {
					return ev, err
				}
				items = append(items, ev)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Undefined(), err
			}
			return jinja.NewList(items), nil
		case '{':
			out := jinja.NewDict()
			d := out.AsDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				k, _ := kt.(string)
				ev, err := decodeJSONValue(dec, depth+1)
				if err != nil {
					return ev, err
				}
				d.Set(k, ev)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Undefined(), err
			}
			return out, nil
		}
	}
	return jinja.Undefined(), fmt.Errorf("unexpected token %v", tok)
}
